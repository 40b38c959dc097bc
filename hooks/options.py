"""``CaptureOptions``: the options ``DumpHook`` and ``InspectCallback`` share, defined and checked
once (pure Python: ``import hooks.options`` works without TensorFlow).

Example::

    from hooks import CaptureOptions, DumpHook
    from hooks.keras import InspectCallback
    opts = CaptureOptions(stats_every_n_steps=10, dump_every_n_steps=100, exclude=r"/dropout/")
    DumpHook("runs/exp1", options=opts)              # tf.estimator / MonitoredTrainingSession
    InspectCallback("runs/keras1", options=opts)     # model.fit

Every option is also a keyword argument of both classes, with the same default:
``DumpHook("runs/exp1", stats_every_n_steps=10)`` is ``DumpHook("runs/exp1",
options=CaptureOptions(stats_every_n_steps=10))``. Give each option one way: an option given
both as a keyword and in ``options=`` is refused (``dataclasses.replace(opts, fsync=True)``
changes one option of an options object). A bad value is refused when the options are built,
before anything is traced.
"""
from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from inspector.format import HIST_MAX_ELEMENTS
from inspector.options import WriterOptions, options_keywords

from .schedule import Schedule, StepSpec

log = logging.getLogger("tf_inspector")

#: The dtypes captured by default: TensorFlow's float types, by name (``tf.as_dtype`` reads them).
FLOAT_DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64")

#: ``groups="per_class"`` makes at most this many groups (rows per tensor and kind: C + 1).
MAX_CLASS_GROUPS = 64

@dataclass(frozen=True)
class CaptureOptions:
    """What ``DumpHook`` and ``InspectCallback`` capture, when, how much, and how they write it.

    Each attribute is a keyword argument of both classes with the same default; the classes
    document only their own arguments (``DumpHook``: the loss, labels, predictions, mode and
    evaluation batches; ``InspectCallback``: the probe, its source and ``training``).
    """

    # ---- which tensors -------------------------------------------------------------------------
    include: str | Sequence[str] | None = None
    """Regexes on tensor names: capture only the tensors matching one (Keras: names in the traced
    graph, e.g. ``sequential/dense/MatMul:0``). None: every tensor the defaults keep."""
    exclude: str | Sequence[str] | None = None
    """Regexes on tensor names never captured, in addition to the defaults, which leave out the
    backward pass, optimizer, saver, summaries and init ops, constants and variables
    (``inspector.format.accounting.DEFAULT_RULES``). What a filter or a default leaves out is
    recorded by rule in the manifest's ``accounting``: ``run.why(name)`` says it (Keras:
    ``outside`` for an op that is neither the model's call nor its loss)."""
    op_types: Iterable[str] | None = None
    """Capture only the outputs of these op types (``"MatMul"``, ``"Relu"``); None: every type."""
    exclude_op_types: Iterable[str] | None = None
    """Never capture the outputs of these op types."""
    dtypes: Sequence[Any] = FLOAT_DTYPE_NAMES
    """Tensor dtypes to capture: TensorFlow dtypes or their names (default: the float types)."""
    batched: str | Sequence[str] | None = None
    """Regexes on tensor names forcing a tensor per-sample (axis 0 is the batch), overriding the
    data-flow trace from the inputs (``hooks.capture.batch_axis``); what is computed from it
    follows it."""
    unbatched: str | Sequence[str] | None = None
    """Regexes on tensor names forcing a tensor not per-sample (no groups, no sample budget);
    ``unbatched`` wins over ``batched``."""
    gradients: bool = True
    """Also capture d loss / d tensor for every captured tensor."""

    # ---- when: the schedule over global steps (``hooks.schedule``) ------------------------------
    stats_every_n_steps: int | None = 100
    """In-graph statistics every N steps (0 or None: never). Steps are global steps (Keras:
    ``optimizer.iterations``) after the step's update; the first training step is 1."""
    layer_stats_every_n_steps: int | None = None
    """Always-on statistics (``DumpHook`` only): every N steps, statistics of each layer's output
    as Grappler's fused ops produce it and of its gradient (``hooks/capture/layers.py``: no
    intermediate output of a fused Conv2D/MatMul + bias/batch norm + activation, no
    ``d loss / d input``), cheap enough for every step of a long run. On the steps
    ``stats_every_n_steps`` samples every op is recorded as without it (the layers' rows are
    among those); dumps, groups and the NaN check of statistics are theirs. 0 or None: off."""
    dump_every_n_steps: int | None = 1000
    """Full dumps (every captured value) every M steps (0 or None: never)."""
    dump_steps: Iterable[StepSpec] = ()
    """Full dumps at these steps and inclusive ranges as well: ``[1, "500:510", (900, 905)]``
    (``"A:B"``, ``"A:"``, ``":B"``, ``range(100, 111)``)."""
    dump_on_nonfinite: bool = False
    """Check the loss every step (Keras: fit's reported loss, one device sync per step) and the
    statistics on statistics steps; when a NaN/Inf first appears, record where (the manifest's
    ``first_nonfinite``) and dump the next step (reason "after NaN/Inf")."""

    # ---- sample groups (``hooks/capture/groups.py``) ---------------------------------------------
    positive: Callable | Any = None
    """Predicate ``labels -> bool [N]`` choosing the positive samples (``InspectCallback``'s probe
    also takes a bool array [N]). Default: ``labels != 0`` for class ids ([N] or [N, 1], any int,
    float or bool dtype), ``argmax(labels) != 0`` for one-hot / probabilities ([N, C > 1]); other
    labels are refused."""
    groups: str | Callable | None = None
    """The sample groups of batched tensors' statistics and dumps: None (positive/negative),
    ``"per_class"`` (``class_0`` ... one per class id, at most ``MAX_CLASS_GROUPS``) or a function
    ``labels[, predictions] -> {name: bool [N]}`` of disjoint groups, e.g. correct vs
    misclassified (predictions: ``DumpHook(predictions=...)`` or the EstimatorSpec's; Keras: the
    model's output)."""
    num_classes: int | None = None
    """The number of classes of ``groups="per_class"`` with class-id labels (one-hot labels, and
    Keras models' outputs, give it themselves)."""

    # ---- how much --------------------------------------------------------------------------------
    samples_per_group: int = 2
    """Sample budget of a full dump: this many samples of each group (the first ones by batch
    index); twice this many without labels."""
    max_bytes: int | None = 2 * 1024 ** 3
    """Byte budget of the run directory as this worker sees it (the files already there count);
    dumps beyond it are dropped, and the drops recorded. None: no budget."""
    histogram_bins: int | None = None
    """Ignored, with a warning: the in-graph histograms have fixed log-magnitude buckets, 8 per
    power of two (FORMAT.md, "Histograms")."""
    native_stats: bool = True
    """Compute statistics with the fused kernel (``hooks/native``, compiled once per machine
    where a C++ compiler exists). False, or no compiler: stock TensorFlow ops, the same values,
    several times the op time (bench/README.md)."""

    # ---- writing ---------------------------------------------------------------------------------
    worker: str | None = None
    """This writer's name in the run directory's file names (default: the task in ``TF_CONFIG``,
    else ``"chief"``). Two live writers of one name in one run directory are refused."""
    queue_size: int = 8
    """Full dumps waiting to be written; a dump beyond it is dropped (and recorded) rather than
    stall training."""
    stats_flush_secs: float = 10.0
    """Statistics are written as a part file at least this often (seconds); 0: every step's."""
    fsync: bool = False
    """fsync every dump and statistics part before renaming it into place. Off by default: a
    rename is atomic and the page cache survives a crash of the training process (even SIGKILL),
    so completed files stay readable; only a power loss or a kernel crash can leave a recent file
    short (the reader then reports it as damaged). The manifest is always fsynced. On: one disk
    flush per file (a full dump is tens of MB), which makes the writer the bottleneck of
    dump-heavy runs."""
    storage_options: dict[str, Any] | None = None
    """For a URL run directory (``s3://bucket/runs/exp1``, needs ``pip install
    'tf-inspector[s3]'``): its fsspec filesystem's options (endpoint, credentials; default: the
    environment's, as fsspec and s3fs document)."""
    strict: bool = False
    """Raise errors inside the hook instead of logging them and disabling the hook (training then
    goes on, unrecorded)."""

    def __post_init__(self) -> None:
        if isinstance(self.samples_per_group, bool) or not isinstance(self.samples_per_group, int) \
                or self.samples_per_group < 0:
            raise ValueError(f"samples_per_group={self.samples_per_group!r} must be >= 0 (an int)")
        if self.max_bytes is not None and (isinstance(self.max_bytes, bool)
                                           or not isinstance(self.max_bytes, (int, float))
                                           or not self.max_bytes >= 0):
            raise ValueError(f"max_bytes={self.max_bytes!r} must be a byte count >= 0 or None (no "
                             "budget)")
        if self.histogram_bins is not None:
            log.warning("histogram_bins=%r is ignored: histograms have fixed log-magnitude "
                        "buckets, 8 per power of two (FORMAT.md, Histograms); remove the argument",
                        self.histogram_bins)
        if isinstance(self.dtypes, (str, bytes)):
            raise ValueError(f"dtypes={self.dtypes!r} must be a sequence of dtypes, e.g. "
                             f"({self.dtypes!r},)")
        for patterns in (self.include, self.exclude, self.batched, self.unbatched):
            compile_patterns(patterns)
        every = self.layer_stats_every_n_steps
        if every is not None and (isinstance(every, bool) or not isinstance(every, int)
                                  or every < 0):
            raise ValueError(f"layer_stats_every_n_steps={every!r} must be a non-negative int or "
                             "None")
        self.schedule   # built here so that a bad schedule is refused now, not at the first step
        group_kind(self.groups, self.positive, self.num_classes)
        self.writer_options   # the writer's settings too (queue_size...), not at the first session

    @property
    def schedule(self) -> Schedule:
        """Which steps get statistics and full dumps."""
        return Schedule(self.stats_every_n_steps, self.dump_every_n_steps, self.dump_steps)

    @property
    def batch_overrides(self) -> dict[str, Any]:
        """``batched`` / ``unbatched`` as ``hooks.capture.batch_axis.BatchAxis`` takes them."""
        return dict(batched=self.batched, unbatched=self.unbatched)

    def manifest_config(self, native_ran: bool, dtypes: Iterable[Any]) -> dict[str, Any]:
        """The manifest's ``config`` keys these options set (``manifest_schema.CONFIG_DEFAULTS``);
        ``native_ran``: whether the fused kernel computes the statistics; ``dtypes``: the
        TensorFlow dtypes captured (``self.dtypes`` read by ``capture.as_dtypes``)."""
        return {**self.schedule.to_json(),
                "layer_stats_every_n_steps": self.layer_stats_every_n_steps or None,
                "samples_per_group": self.samples_per_group,
                "max_bytes": self.max_bytes,
                "histogram_sample": HIST_MAX_ELEMENTS, "gradients": self.gradients,
                "dump_on_nonfinite": self.dump_on_nonfinite, "strict": self.strict,
                "fsync": self.fsync, "native_stats": native_ran,
                **{k: _jsonable(getattr(self, k))
                   for k in ("include", "exclude", "op_types", "exclude_op_types")},
                "dtypes": [d.name for d in dtypes]}

    @property
    def writer_options(self) -> WriterOptions:
        """The settings of ``inspector.writer.RunWriter`` these options set (checked with them)."""
        return WriterOptions(max_bytes=self.max_bytes, queue_size=self.queue_size,
                             stats_flush_secs=self.stats_flush_secs, strict=self.strict,
                             fsync=self.fsync, storage_options=self.storage_options)


#: the names of the options, each also a keyword argument of DumpHook and InspectCallback
OPTION_NAMES = tuple(f.name for f in dataclasses.fields(CaptureOptions))


#: Decorator of ``__init__``: the shared options come as keywords (each listed in ``init``'s
#: signature with this module's default, for ``help()`` and editors) or as ``options=``;
#: ``init`` receives them resolved in ``options`` and reads them there, not in its keywords.
takes_options = options_keywords(CaptureOptions, "a hooks.CaptureOptions")


def compile_patterns(patterns: str | Iterable[str] | None) -> list[re.Pattern]:
    """``include`` / ``exclude`` / ``batched`` / ``unbatched`` as compiled regexes (a string is
    one)."""
    if patterns is None:
        return []
    if isinstance(patterns, str):
        patterns = [patterns]
    out = []
    for p in patterns:
        try:
            out.append(re.compile(p))
        except (re.error, TypeError) as e:
            raise ValueError(f"bad regular expression {p!r} in include/exclude: {e}") from None
    return out


def group_kind(groups: Any, positive: Any = None, num_classes: int | None = None) -> str:
    """``groups=`` / ``positive=`` / ``num_classes=`` checked: the kind of groups they ask for
    ('positive_negative', 'per_class' or 'function'), else ValueError saying what is right."""
    if num_classes is not None \
            and (isinstance(num_classes, bool) or not isinstance(num_classes, int)
                 or num_classes < 1):
        raise ValueError(f"num_classes={num_classes!r} must be a positive int")
    if groups is None or (isinstance(groups, str) and groups == "positive_negative"):
        return "positive_negative"
    if positive is not None:
        raise ValueError("positive= chooses the positive/negative groups; with groups= it has no "
                         "meaning")
    if isinstance(groups, str) and groups == "per_class":
        check_classes(num_classes)
        return "per_class"
    if callable(groups):
        return "function"
    raise ValueError(f"groups={groups!r} must be None (positive/negative), 'per_class' or a "
                     f"function labels[, predictions] -> {{name: bool [N]}}")


def check_classes(n: int | None) -> None:
    """ValueError for more classes than ``groups="per_class"`` makes groups."""
    if n is not None and n > MAX_CLASS_GROUPS:
        raise ValueError(f"groups='per_class' with {n} classes: at most {MAX_CLASS_GROUPS} groups "
                         "are made (one statistics row per class and tensor); pass "
                         f"groups=<function> that pools classes into named groups instead")


def _jsonable(v: Any) -> Any:
    """A filter option as the manifest keeps it: None, a string, or a list."""
    if v is None or isinstance(v, str):
        return v
    return list(v)
