"""Where every float op output of a session's graph went: captured, skipped (why)
or excluded (which rule).

The hook records it once per writer session, under the manifest's ``accounting`` key
(FORMAT.md, "Accounting"): counts per rule, and names only where no pattern or op type says
it. :class:`Ledger` answers for any name from that record and the session's graph (op types
from ``graph.<worker>.s<session>.pb``), without TensorFlow. The default rules are defined
here once; ``hooks.capture`` builds its default filters from them.

Example::

    run = inspector.open_run("runs/exp1")
    run.why("loss/Const:0")    # Why(status='excluded', rule='constant', ...)
    run.accounting()           # one row per captured / skip reason / rule, with counts
"""
from __future__ import annotations

import bisect
import itertools
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

#: What a name can be. ``not_float``: an op of the graph, but not an output the capture
#: considers (not floating point); ``absent``: no op of the session's graph; ``unknown``: the
#: run predates the accounting and nothing else says.
STATUSES = ("captured", "skipped", "excluded", "not_float", "absent", "unknown")
#: ``Rule.source``: a default rule, one of the hook's filters, or the Keras capture's region
SOURCES = ("default", "user", "keras", "hook")
#: How many names of a rule the record keeps as examples (for display: the rule says the rest)
EXAMPLES = 5

#: the names inside a skip reason that make one reason per tensor (the variable a racy read
#: reads, the Identity a TF2 cond output's value is): without them, one reason per kind
_NAMED_IN_REASON = (re.compile(r"^it reads \S+(?=, which the training step writes)"),
                    re.compile(r"(?<=its value is )\S+(?=, which the filters leave out)"))
_NAMELESS = ("it reads a variable", "an Identity")


def reason_kind(reason: str) -> str:
    """``reason`` without the one name that makes it one tensor's (for a log or summary line
    per kind of reason; the manifest keeps every tensor's reason in full)."""
    for pattern, nameless in zip(_NAMED_IN_REASON, _NAMELESS):
        reason = pattern.sub(nameless, reason)
    return reason


@dataclass(frozen=True)
class Rule:
    """One reason an output is left out. It applies to a tensor name when one of its
    ``patterns`` matches (only the default patterns are ever evaluated from a manifest: a
    reader runs no regular expression a file brought), its op type is in ``op_types`` (not
    in it, when ``negate``: ``op_types=``), or the name is in ``names`` (what no pattern says:
    a data-flow rule, a user's regex, ``dtypes=``)."""
    rule: str
    what: str
    source: str = "default"
    patterns: tuple[str, ...] = ()
    op_types: frozenset[str] = frozenset()
    negate: bool = False
    names: frozenset[str] = frozenset()

    def matches(self, name: str, op_type: str | None) -> bool:
        """Whether the rule's patterns or op types say ``name`` (of an op of type ``op_type``,
        None: unknown) is left out; explicit ``names`` aside."""
        if self.negate:   # include= (never evaluated) and op_types= (what it does not list)
            return bool(self.op_types) and op_type is not None and op_type not in self.op_types
        if op_type is not None and op_type in self.op_types:
            return True
        rx = _evaluable(self.patterns)
        return rx is not None and rx.search(name) is not None

    def record(self, count: int, names: Sequence[str], examples: Sequence[str]) -> dict[str, Any]:
        """The manifest's entry (FORMAT.md, "Accounting")."""
        return {"rule": self.rule, "source": self.source, "what": self.what,
                "patterns": list(self.patterns), "op_types": sorted(self.op_types),
                "negate": self.negate, "count": count, "names": list(names),
                "examples": list(examples)}

    @classmethod
    def from_record(cls, r: Mapping[str, Any]) -> "Rule":
        return cls(r["rule"], r.get("what", ""), r.get("source", "default"),
                   tuple(r.get("patterns", ())), frozenset(r.get("op_types", ())),
                   bool(r.get("negate", False)), frozenset(r.get("names", ())))


_BACKWARD = r"(^|/)gradients(_\d+)?/"
#: The default rules, in the order a name is matched against them (the first that applies is
#: the one named): the name scopes first (``gradients/Fill`` is the backward pass's before it is
#: a constant), then the op types. ``hooks.capture.select.DEFAULT_EXCLUDE`` and
#: ``DEFAULT_EXCLUDE_OP_TYPES`` are their union.
DEFAULT_RULES: tuple[Rule, ...] = (
    Rule("inspector", "the inspector's own ops (tf_inspector/ scope: statistics, dumps, its "
                      "gradients)",
         patterns=(r"^tf_inspector(_\d+)?/",)),
    Rule("backward", "the backward pass: gradients/ scopes, and every op computed from one "
                     "(gradient clipping, an optimizer's update)", patterns=(_BACKWARD,)),
    Rule("optimizer", "optimizers: their scopes and slots, Adam's beta powers, learning-rate "
                      "schedules, moving averages",
         patterns=(r"(^|/)(Adam|Momentum|GradientDescent|RMSProp|Adagrad|Adadelta|Ftrl|SGD|"
                   r"Nadam|Adamax)(_\d+)?(/|$)",
                   r"(^|/)beta[12]_power",
                   r"(^|/)(ExponentialMovingAverage|learning_rate|PiecewiseConstant|"
                   r"ExponentialDecay)(_\d+)?(/|$)")),
    Rule("saver", "the saver: save/ scope, SaveV2 and RestoreV2", patterns=(r"^save(_\d+)?/",),
         op_types=frozenset({"SaveV2", "RestoreV2"})),
    Rule("summaries", "summaries: summary/ scopes and summary ops",
         patterns=(r"(^|/)summar(y|ies)(_\d+)?/",),
         op_types=frozenset({"ScalarSummary", "HistogramSummary", "ImageSummary", "MergeSummary",
                             "TensorSummaryV2"})),
    Rule("init", "initialization: init ops, initializers, is-initialized checks, NoOp groups",
         patterns=(r"^(init|init_all_tables|group_deps)(_\d+)?$", r"^report_uninitialized",
                   r"(^|/)(Initializer|Assign|IsInitialized|IsVariableInitialized)(_\d+)?(/|$)"),
         op_types=frozenset({"NoOp", "VarIsInitializedOp", "IsVariableInitialized"})),
    Rule("global_step", "the global step and its increment", patterns=(r"^global_step",)),
    Rule("variables", "variables and assignments to them: a variable's value is captured as its "
                      "read (ReadVariableOp, w/read) and its variable record",
         op_types=frozenset({"VariableV2", "VarHandleOp", "Assign", "AssignAdd", "AssignSub",
                             "AssignVariableOp", "AssignAddVariableOp"})),
    Rule("constant", "constant-like ops: Const, Fill, ZerosLike, OnesLike, Shape (values fixed by "
                     "the graph or by a shape)",
         op_types=frozenset({"Const", "Fill", "ZerosLike", "OnesLike", "Shape"})),
    Rule("blocking", "takes a gradient accumulator's value, which another run fills "
                     "(SyncReplicasOptimizer's chief): fetching it would block the training step",
         op_types=frozenset({"AccumulatorTakeGradient", "ResourceAccumulatorTakeGradient",
                             "SparseAccumulatorTakeGradient"})),
)
#: The rule of the hook's own ops: they are added after the session's graph is saved, so it
#: applies to names that graph lacks
INSPECTOR_RULE = "inspector"
#: Every pattern a reader evaluates: the default rules' (a manifest's other patterns are shown,
#: never run; names they exclude are listed)
KNOWN_PATTERNS = frozenset(p for r in DEFAULT_RULES for p in r.patterns)
_COMPILED: dict[tuple[str, ...], re.Pattern | None] = {}


def _evaluable(patterns: tuple[str, ...]) -> re.Pattern | None:
    """One regex of the known ones among ``patterns`` (None: none is known)."""
    if patterns not in _COMPILED:
        known = [p for p in patterns if p in KNOWN_PATTERNS]
        _COMPILED[patterns] = re.compile("|".join(f"(?:{p})" for p in known)) if known else None
    return _COMPILED[patterns]


def user_rules(include=None, exclude=None, op_types=None, exclude_op_types=None,
               dtypes: Sequence[str] | None = None) -> list[Rule]:
    """The rules of a hook's filters (JSON forms: regex strings or lists, op type names, dtype
    names), after the defaults in the hook's order of checks; none for a filter not given."""
    def listed(v) -> list[str]:
        return [] if v is None else [v] if isinstance(v, str) else list(v)
    out = []
    if exclude_op_types:
        out.append(Rule("exclude_op_types", f"exclude_op_types={sorted(exclude_op_types)}", "user",
                        op_types=frozenset(exclude_op_types)))
    if op_types:
        out.append(Rule("op_types", f"op_types={sorted(op_types)}: another op type", "user",
                        op_types=frozenset(op_types), negate=True))
    if dtypes is not None:
        out.append(Rule("dtypes", f"dtypes={list(dtypes)}: another float dtype", "user"))
    if include is not None:
        out.append(Rule("include", f"include={listed(include)}: matched by none", "user",
                        patterns=tuple(listed(include)), negate=True))
    if exclude is not None:
        out.append(Rule("exclude", f"exclude={listed(exclude)}", "user",
                        patterns=tuple(listed(exclude))))
    return out


#: Keras: what lies outside the model's call and the ops its loss is computed from
OUTSIDE = Rule("outside", "outside the model's call and its loss (the loss trackers and metrics, "
                          "the train step's gradient tape and optimizer, the function's "
                          "arguments)", "keras")
#: DumpHook: an output no rule explains (none should be: a test asserts it)
UNACCOUNTED = Rule("unaccounted", "left out for no recorded reason: a bug of the hook (please "
                                  "report it)", "hook")


def record(outputs: Iterable[tuple[str, str]], captured: Iterable[str], aliases: Mapping[str, str],
           skipped: Mapping[str, str], excluded: Mapping[str, str], rules: Sequence[Rule],
           rest: Rule) -> dict[str, Any]:
    """The manifest's ``accounting`` (FORMAT.md). ``outputs``: (tensor name, op type) of every
    output of the graph the capture considered (float, or of the hook's ``dtypes``);
    ``captured``: the catalog's names; ``aliases``: a TF2 cond output -> the captured Identity
    holding its value; ``skipped``: name -> why; ``excluded``: name -> the id of the rule the
    capture left it out by, used where no rule's patterns or op types say it (the name is then
    listed); ``rest``: the rule of outputs in none of these."""
    rules = [r for r in rules if r.rule != rest.rule] + [rest]
    by_id = {r.rule: r for r in rules}
    captured = set(captured)
    counts = dict.fromkeys(by_id, 0)
    listed: dict[str, list[str]] = {r: [] for r in by_id}
    examples: dict[str, list[str]] = {r: [] for r in by_id}
    n_captured = 0
    for name, op_type in outputs:
        if name in captured or name in aliases:
            n_captured += 1
            continue
        if name in skipped:
            continue
        first = next((r for r in rules if r.matches(name, op_type)), None)
        if first is None:
            first = by_id.get(excluded.get(name, rest.rule), rest)
            listed[first.rule].append(name)
        counts[first.rule] += 1
        if len(examples[first.rule]) < EXAMPLES:
            examples[first.rule].append(name)
    reasons: dict[str, list[str]] = {}
    for name, why in skipped.items():
        reasons.setdefault(why, []).append(name)
    return {"total": n_captured + len(skipped) + sum(counts.values()), "captured": n_captured,
            "aliases": dict(aliases),
            "skipped": [{"reason": why, "count": len(names), "names": names}
                        for why, names in reasons.items()],
            "excluded": [r.record(counts[r.rule], listed[r.rule], examples[r.rule]) for r in rules]}


@dataclass(frozen=True)
class Why:
    """What happened to ``name`` in one session: ``status`` (one of :data:`STATUSES`), a
    sentence saying why, and for an excluded name its ``rule`` and the rule's ``source``
    (default, user, keras); ``captured_as``: the catalog names holding its value."""
    name: str
    status: str
    reason: str
    rule: str | None = None
    source: str | None = None
    op_type: str | None = None
    captured_as: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.name}: {self.status}: {self.reason}"


class Ledger:
    """One session's accounting (its manifest) and its graph's op types (None: no readable
    graph file), to answer :meth:`why` for any name."""

    def __init__(self, manifest: Mapping[str, Any],
                 op_types: Mapping[str, str] | None = None) -> None:
        self.manifest, self.op_types = manifest, op_types
        acc = manifest.get("accounting")
        self.recorded = isinstance(acc, dict)
        acc = acc if isinstance(acc, dict) else {}
        self.rules = [Rule.from_record(r) for r in acc.get("excluded", [])]
        self.aliases: dict[str, str] = dict(acc.get("aliases", {}))
        self.reasons = {n: s["reason"] for s in acc.get("skipped", []) for n in s.get("names", [])}
        self.skipped = set(manifest.get("skipped", [])) | set(self.reasons)
        self.catalog: dict[str, list[str]] = {}   # a name or op name -> catalog names
        for t in manifest.get("tensors", []):
            self.catalog.setdefault(t["name"], []).append(t["name"])
            if t.get("kind", "tensor") == "tensor" and t.get("op"):
                self.catalog.setdefault(t["op"], []).append(t["name"])
        # op -> its listed names (skipped, aliased, rules' names)
        self._by_op: dict[str, list[str]] = {}
        for n in [*self.skipped, *self.aliases, *(n for r in self.rules for n in r.names)]:
            self._by_op.setdefault(_op_of(n), []).append(n)
        self._index_rules()
        self._haystack: tuple[list[str], str, list[int]] | None = None   # search(): built once
        self._types: dict[str, list[int]] = {}   # search(): an op type -> its names' places

    def _index_rules(self) -> None:
        """The indexes :meth:`_first_rule` answers from, so a lookup costs a few dict reads
        and one search per known pattern, whatever the number of rules and listed names."""
        self._listed: dict[str, Rule] = {}   # a listed name -> the first rule listing it
        self._by_type: dict[str, int] = {}   # an op type -> the first rule naming it
        self._by_pattern: dict[str, int] = {}   # a known pattern -> the first rule holding it
        self._negated: list[tuple[int, Rule]] = []   # op_types=: what it does not list
        for i, r in enumerate(self.rules):
            for n in r.names:
                self._listed.setdefault(n, r)
            if r.negate:
                if r.op_types:
                    self._negated.append((i, r))
                continue
            for t in r.op_types:
                self._by_type.setdefault(t, i)
            for p in r.patterns:
                if p in KNOWN_PATTERNS:
                    self._by_pattern.setdefault(p, i)
        self._regex = {p: re.compile(p) for p in self._by_pattern}

    def _first_rule(self, tensor: str, op_type: str | None) -> Rule | None:
        """The first rule whose patterns or op types say ``tensor`` (:meth:`Rule.matches`)."""
        best = len(self.rules)
        if op_type is not None:
            best = self._by_type.get(op_type, best)
            best = next((i for i, r in self._negated if i < best and op_type not in r.op_types),
                        best)
        for p, i in self._by_pattern.items():
            if i < best and self._regex[p].search(tensor):
                best = i
        return self.rules[best] if best < len(self.rules) else None

    def why(self, name: str) -> Why:
        """Captured, skipped (why), excluded (which rule), or what else ``name`` is. An op name
        stands for its outputs: captured if any is, else skipped, else excluded."""
        if name in self.catalog:
            return Why(name, "captured",
                       "in the catalog (run.tensors)" if self.catalog[name] == [name] else
                       f"captured as {', '.join(self.catalog[name])}",
                       captured_as=tuple(self.catalog[name]))
        tensor = name if ":" in name else self._representative(name)
        op, op_type = _op_of(tensor), self._op_type(tensor)
        if tensor in self.aliases:
            return Why(name, "captured", f"captured as {self.aliases[tensor]}: a TF2 cond's "
                       "output, which TensorFlow marks not fetchable; the Identity tf.cond "
                       "returned holds its value", op_type=op_type,
                       captured_as=(self.aliases[tensor],))
        if tensor in self.skipped:
            return Why(name, "skipped",
                       self.reasons.get(tensor, "not fetchable (this run predates the accounting, "
                                                 "which records why)"), op_type=op_type)
        rule = self._listed.get(tensor)
        present = self.op_types is None or op in self.op_types
        first = self._first_rule(tensor, op_type) if rule is None else None
        # the hook's ops: made after the graph
        if first is not None and (present or first.rule == INSPECTOR_RULE):
            rule = first
        if rule is not None:
            return Why(name, "excluded", f"excluded by the {rule.source} rule '{rule.rule}': "
                                         f"{rule.what}", rule.rule, rule.source, op_type)
        if not self.recorded:
            return Why(name, "unknown", "this run predates the accounting: not in the catalog nor "
                       "skipped, and its manifest does not say why", op_type=op_type)
        if not present:
            return Why(name, "absent", f"no op {op} in this session's graph", op_type=op_type)
        return Why(name, "not_float", f"op {op} ({op_type or 'type unknown'}) is in the graph, but "
                   f"{tensor} is no output the capture considers (not floating point, or no such "
                   "output)", op_type=op_type)

    def _representative(self, op: str) -> str:
        """The output that speaks for op ``op``: a listed one,
        skipped before excluded; else ``op:0``."""
        names = self._by_op.get(op, [])
        return next((n for n in names if n in self.skipped), names[0] if names else f"{op}:0")

    def _op_type(self, tensor: str) -> str | None:
        return None if self.op_types is None else self.op_types.get(_op_of(tensor))

    def table(self) -> list[dict[str, Any]]:
        """One row per status / skip reason / rule with outputs: status, rule, source, what,
        count, examples (empty for a run without the accounting)."""
        acc = self.manifest.get("accounting")
        if not isinstance(acc, dict):
            return []
        rows = [{"status": "captured", "rule": None, "source": None, "what": "in the catalog, or a "
                 "TF2 cond output captured as its Identity", "count": acc.get("captured", 0),
                 "examples": []}]
        rows += [{"status": "skipped", "rule": None, "source": None, "what": s["reason"],
                  "count": s["count"], "examples": s["names"][:EXAMPLES]}
                 for s in acc.get("skipped", [])]
        # a rule recorded without a source is a default one (Rule.from_record)
        rows += [{"status": "excluded", "rule": r["rule"], "source": r.get("source", "default"),
                  "what": r.get("what", ""), "count": r["count"], "examples": r.get("examples", [])}
                 for r in acc.get("excluded", []) if r["count"]]
        return rows

    def search(self, text: str, limit: int = 200) -> list[Why]:
        """The names not captured (skipped or excluded) whose name or op type contains ``text``
        (case-insensitive): the graph's ops and the skipped names; at most ``limit``."""
        out = []
        for name in self._candidates(text.lower()):
            why = self.why(name)
            if why.status in ("skipped", "excluded"):
                out.append(why)
                if len(out) >= limit:
                    break
        return out

    def _candidates(self, text: str) -> list[str]:
        """The names :meth:`search` considers whose name or op type contains ``text`` (lower
        case), in its order: found in one string of every lower-cased name (built once), not
        by a loop over the names."""
        if self._haystack is None:
            ops = self.op_types or {}
            # an op's row speaks for its outputs; skipped names of no op of the graph (inside
            # functions) have their own
            names = [*ops, *sorted(n for n in self.skipped if _op_of(n) not in ops)]
            starts = list(itertools.accumulate((len(n) + 1 for n in names), initial=0))
            self._haystack = names, "\n".join(n.lower() for n in names), starts
            types: dict[str, list[int]] = {}
            for i, n in enumerate(names):
                t = self._op_type(n if ":" in n else f"{n}:0")
                if t:
                    types.setdefault(t.lower(), []).append(i)
            self._types = types
        names, hay, starts = self._haystack
        if not text:
            return names
        if "\n" in text:   # no name holds one (the haystack's separator)
            return []
        hits = {bisect.bisect_right(starts, m.start()) - 1
                for m in re.finditer(re.escape(text), hay)}
        hits.update(i for t, at in self._types.items() if text in t for i in at)
        return [names[i] for i in sorted(hits)]


def _op_of(name: str) -> str:
    """The op of a tensor name (``a/b:0`` -> ``a/b``); an op name as it is."""
    op, colon, index = name.rpartition(":")
    return op if colon and index.isdigit() else name
