"""The slow tier: tests ``make test`` skips and ``make test-all`` (and CI) runs.

tests/slow.txt lists them, one ``file::test function`` (or a whole ``file``) per line. It is
made from measured times, so the fast tier keeps every test that takes a few seconds, and with
them cheap tests of every feature, and runs within minutes on two cores::

    TF_INSPECTOR_TEST_TIMES=/tmp/times.tsv make test-all     # each test's phases, as they finish
    python tests/tiers.py /tmp/times.tsv 6                   # rewrite slow.txt: tests over 6 s

Names are checked against the files at start, so a renamed test cannot leave the list silently.
Files whose slow tests also run under the latest TensorFlow in CI (their code differs between
tf.keras 2.15 and Keras 3, or between TensorFlow versions) are ``BOTH_TFS``.
"""
from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
LIST = HERE / "slow.txt"

#: test files whose slow tests CI runs under both TensorFlows (marker ``both_tfs``)
BOTH_TFS = frozenset({
    "test_keras.py", "test_keras_groups.py", "test_keras_layers.py", "test_keras_execution.py", "test_keras_step.py", "test_keras_defaults.py", "test_keras_icnn.py", "test_batch_axis.py",
    "test_accounting.py", "test_hook.py", "test_hook_mixed_precision.py", "test_fast_stats.py", "test_variables.py",
    "test_quantiles.py", "test_shared_gradients.py", "test_lifecycle.py", "test_native_cache.py", "test_keras_loop.py",
    "test_replicas.py", "test_prewarm.py",
})


#: tests kept in the fast tier whatever they take: the one test of a feature the fast tier
#: would otherwise not touch (a remote read's row-group index, the TensorBoard export in a
#: browser, the graph page in a browser, ICNN localization, the multi-class viewer, the hook
#: writing to an object store)
KEEP_FAST = frozenset({
    "test_storage_index.py::test_one_tensor_reads_only_its_row_groups_remotely",
    "test_browser_tensorboard.py::test_histograms_dashboard_shows_positive_and_negative_samples",
    "test_browser_graph.py::test_summary_names_where_the_first_nan_was_created",
    "test_masks_localization.py::test_verdict_states_n_and_the_negatives_spread",
    "test_icnn_multiclass_viewer.py::test_a_dump_without_the_class_labels_gives_no_split",
    "test_storage_hook.py::test_same_training_reads_the_same_from_disk_and_bucket",
    "test_keras_loop.py::test_the_readme_example_records_its_steps_exactly",
})


def slow_entries() -> set[str]:
    """The lines of slow.txt: ``file`` or ``file::function`` (comments after '#')."""
    lines = (line.split("#")[0].strip() for line in LIST.read_text().splitlines()) if LIST.exists() else ()
    return {line for line in lines if line}


def is_slow(entries: set[str], file: str, function: str) -> bool:
    return file in entries or f"{file}::{function}" in entries


def check_listed(entries: set[str], folder: Path = HERE) -> None:
    """Every listed file exists and every listed test is defined in its file."""
    texts: dict[str, str | None] = {}   # each file read once
    missing = []
    for entry in sorted(entries):
        file, _, test = entry.partition("::")
        if file not in texts:
            texts[file] = (folder / file).read_text() if (folder / file).is_file() else None
        text = texts[file]
        if text is None or (test and f"def {test}(" not in text):
            missing.append(entry)
    if missing:
        raise pytest.UsageError(f"tests/slow.txt lists tests that do not exist: {', '.join(missing)}")


def write_list(times: Path, seconds: float) -> list[str]:
    """slow.txt from a times file (``nodeid, phase, seconds, outcome`` per line): each test
    function one of whose cases took more than ``seconds``, setup and teardown included,
    except those in KEEP_FAST."""
    per_case: dict[str, float] = defaultdict(float)
    for line in times.read_text().splitlines():
        nodeid, _, took, _ = line.split("\t")
        per_case[nodeid] += float(took)
    slow = sorted({Path(n.split("::")[0]).name + "::" + n.split("::")[-1].split("[")[0]
                   for n, took in per_case.items() if took > seconds} - KEEP_FAST)
    LIST.write_text(f"# tests over {seconds:g} s (setup + call + teardown) in a measured run: "
                    f"python tests/tiers.py TIMES {seconds:g}\n" + "".join(f"{s}\n" for s in slow))
    return slow


if __name__ == "__main__":
    print(len(write_list(Path(sys.argv[1]), float(sys.argv[2]))), "slow tests written to", LIST)
