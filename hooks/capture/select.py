"""Graph side of the dump hook: which tensors to capture, their gradients, the dump fetches.

Everything here runs once, in ``DumpHook.begin()``, before the graph is finalized. The
result is three kinds of fetches: one fused statistics matrix per step, a dict of
full tensors (only the kept samples) for dump steps, and the kept samples' metadata.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import tensorflow as tf

from hooks.capture.fetchable import (_functions_of, _v2_cond_alias, _why_unfetchable, ancestors,
                                     backward_ops, ran_by_training, ref_aliases, side_effects,
                                     unordered_reads)
from hooks.options import FLOAT_DTYPE_NAMES, CaptureOptions, compile_patterns
from inspector.format import ICNN_COLLECTION, icnn_catalog_fields, parse_icnn_entry
from inspector.format.accounting import (DEFAULT_RULES, UNACCOUNTED, Rule, reason_kind, record,
                                         user_rules)

if TYPE_CHECKING:   # a Captured's grouping; groups.py needs Captured only as a type
    from hooks.capture.groups import Groups

log = logging.getLogger("tf_inspector")


#: Name patterns left out by default: the backward pass, optimizers, saver, summaries, init
#: (``inspector.format.accounting.DEFAULT_RULES``, which names each rule).
DEFAULT_EXCLUDE = tuple(p for r in DEFAULT_RULES for p in r.patterns)


#: Op types never worth capturing (no values, constants, variable plumbing, summaries, I/O),
#: and blocking takes another run performs: SyncReplicasOptimizer's chief takes the aggregated
#: gradients in a queue runner of its own, and fetching one in a training step ran it there,
#: waiting forever for gradients.
DEFAULT_EXCLUDE_OP_TYPES = frozenset(t for r in DEFAULT_RULES for t in r.op_types)


FLOAT_DTYPES = tuple(tf.as_dtype(name) for name in FLOAT_DTYPE_NAMES)


@dataclass
class Captured:
    """One captured tensor and what the catalog says about it."""
    tensor: tf.Tensor
    batched: bool
    gradient: tf.Tensor | None = None
    icnn_layer: str | None = None
    icnn_role: str | None = None
    #: more catalog fields: feeds, zero_gradient_expected (feeds.py), variable (hooks/variables.py)
    extra: dict = field(default_factory=dict)
    #: the groups of this tensor's own samples when they are not the labels' batch (a tower's
    #: slice, hooks/capture/towers.py); None: the run's groups (batched tensors)
    grouping: "Groups | None" = None

    @property
    def name(self) -> str:
        return self.tensor.name

    def catalog_entry(self) -> dict:
        t, op = self.tensor, self.tensor.op
        shape = None if t.shape.rank is None else [d for d in t.shape.as_list()]
        return {"name": t.name, "op": op.name, "op_type": op.type, "dtype": t.dtype.name,
                "shape": shape, "scope": op.name.rpartition("/")[0],
                "has_gradient": self.gradient is not None, "batched": self.batched,
                "icnn_layer": self.icnn_layer, "icnn_role": self.icnn_role, **self.extra}


@dataclass
class Selection:
    tensors: list[tf.Tensor]
    skipped: list[str] = field(default_factory=list)   # names that cannot be fetched
    #: skipped name -> why it cannot be fetched
    reasons: dict[str, str] = field(default_factory=dict)
    #: a TF2 cond's output (not fetchable) -> the Identity tf.cond returned for it, captured:
    #: the same value under the name the model holds, so not skipped
    aliases: dict[str, str] = field(default_factory=dict)
    #: every other float output of the graph -> the rule that left it out (its id in
    #: ``inspector.format.accounting``: "backward", "constant", "include", ...)
    excluded: dict[str, str] = field(default_factory=dict)

    def within(self, ops: set[str]) -> Selection:
        """The same tensors and exclusions; the skipped tensors and aliases of ``ops`` only (what
        a Keras trace captures from: tensors outside it were never candidates, fetchable or not)."""
        def own(name: str) -> bool:
            return name.rpartition(":")[0] in ops
        return Selection(self.tensors, [n for n in self.skipped if own(n)],
                         {n: r for n, r in self.reasons.items() if own(n)},
                         {n: a for n, a in self.aliases.items() if own(n)}, self.excluded)


def grouping_of(cap: Captured, groups: Groups | None) -> Groups | None:
    """The groups ``cap``'s samples are split by: its own (a tower's), else the run's if it is
    batched, else none."""
    if not cap.batched:
        return None
    return cap.grouping if cap.grouping is not None else groups


def filters_of(options: CaptureOptions) -> dict:
    """The tensor filters of ``options`` as ``select_tensors`` takes them, the dtypes
    TensorFlow's."""
    return dict(include=options.include, exclude=options.exclude, op_types=options.op_types,
                exclude_op_types=options.exclude_op_types, dtypes=as_dtypes(options.dtypes))


def as_dtypes(dtypes: Iterable) -> tuple[tf.DType, ...]:
    """``dtypes=`` as TensorFlow dtypes (names, numpy dtypes and ``tf.DType`` are all taken)."""
    out = []
    for d in dtypes:
        try:
            out.append(tf.as_dtype(d))
        except TypeError:
            raise ValueError(f"dtypes entry {d!r} is not a dtype: pass TensorFlow dtypes or their "
                             f"names, e.g. dtypes=[tf.float32] or dtypes=['float32']") from None
    return tuple(out)


def _sort_unfetchable(unfetchable: list[tf.Tensor], captured: set[str]) -> Selection:
    """The skipped names with their reasons, and the TF2 cond outputs whose value is captured
    as the Identity tf.cond returned (an alias: not skipped)."""
    out = Selection([])
    for t in unfetchable:
        alias = _v2_cond_alias(t)
        if alias is not None and alias.name in captured:
            out.aliases[t.name] = alias.name
            continue
        out.skipped.append(t.name)
        out.reasons[t.name] = (_why_unfetchable(t.graph, t) if alias is None else
                               "a TF2 cond's output that TensorFlow marks not fetchable; its "
                               f"value is {alias.name}, which the filters leave out")
    return out


@dataclass
class _Filters:
    """The capture's filters, compiled, each naming its rule (``inspector.format.accounting``)."""
    include: list[re.Pattern]
    exclude: list[re.Pattern]                 # the user's
    defaults: list[tuple[re.Pattern, str]]    # the default name patterns and their rules
    types: set[str] | None                    # op_types=
    skip_types: dict[str, str]                # op type -> the rule that leaves it out
    dtypes: Sequence[tf.DType]

    def op_rule(self, op: tf.Operation, backward: set[str]) -> str | None:
        """The rule that leaves out every output of ``op``, or None."""
        if op.name in backward:
            return "backward"
        if op.type in self.skip_types:
            return self.skip_types[op.type]
        return "op_types" if self.types and op.type not in self.types else None

    def tensor_rule(self, t: tf.Tensor) -> str | None:
        """The rule that leaves out ``t`` (an output of an op no :meth:`op_rule` leaves out), or
        None."""
        if t.dtype.base_dtype not in self.dtypes:
            return "dtypes"
        if self.include and not any(p.search(t.name) for p in self.include):
            return "include"
        if any(p.search(t.name) for p in self.exclude):
            return "exclude"
        return next((rule for p, rule in self.defaults if p.search(t.name)), None)


def _filters(include, exclude, op_types, exclude_op_types, dtypes,
             use_default_exclude: bool) -> _Filters:
    # the first rule naming it wins
    skip = {t: r.rule for r in reversed(DEFAULT_RULES) for t in r.op_types}
    skip = {**dict.fromkeys(exclude_op_types or (), "exclude_op_types"), **skip}
    defaults = [(re.compile(p), r.rule) for r in DEFAULT_RULES for p in r.patterns] \
        if use_default_exclude else []
    return _Filters(compile_patterns(include), compile_patterns(exclude), defaults,
                    set(op_types) if op_types else None, skip, tuple(dtypes))


def accountable(t: tf.Tensor, dtypes: Sequence[tf.DType] = FLOAT_DTYPES) -> bool:
    """Whether the accounting (``inspector.format.accounting``) counts ``t``: a float output, or one
    of the capture's ``dtypes``."""
    return t.dtype.base_dtype in FLOAT_DTYPES or t.dtype.base_dtype in dtypes


def select_tensors(graph: tf.Graph, *, include=None, exclude=None,
                   op_types: Iterable[str] | None = None,
                   exclude_op_types: Iterable[str] | None = None,
                   dtypes: Sequence[tf.DType] = FLOAT_DTYPES, forced: Iterable[tf.Tensor] = (),
                   use_default_exclude: bool = True, loss: tf.Tensor | None = None,
                   fetched: bool = False) -> Selection:
    """Outputs of every forward op that pass the filters (plus ``forced`` tensors); ``loss``:
    what it is computed from is forward (:func:`backward_ops`). Those that cannot be fetched
    are skipped, with the reason, unless their value is captured as a TF2 cond's Identity.
    ``fetched`` (DumpHook: its tensors are fetches of the training's own runs): also skipped,
    with the reason, a tensor whose fetch would run a stateful op training does not run
    (:func:`side_effects`): the hook must not change what training does. Every other float
    output is in ``excluded``, with the rule that left it out."""
    filters = _filters(include, exclude, op_types, exclude_op_types, dtypes, use_default_exclude)
    # the caller's patterns: one that matches no name is a typo (warned)
    given = filters.include + filters.exclude
    matched: set[int] = set()
    backward = backward_ops(graph, loss)
    forced = list(forced)
    forced_names = {t.name for t in forced}
    # A fetch runs everything its tensor is computed from: a read gated on the user's own
    # occasional assign_add, or a v1 loop's result whose loop has effects, ran them on every
    # sampled step (the user's counter would count the hook's fetches).
    # Without a loss or a TRAIN_OP nothing says what training runs (its input pipeline, even):
    # the rule would skip every tensor, so it is not applied there.
    known = loss is not None or bool(graph.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP))
    ran = ran_by_training(graph, loss) if fetched and known else set()
    effects = side_effects(graph, ran) if ran else {}
    # A read of a variable the step writes, off the loss's path, is in no order with the write.
    of_loss = {n.rpartition(":")[0] for n in ancestors(loss)} if loss is not None else set()
    racy = unordered_reads(graph, ran, of_loss) if ran and loss is not None else {}
    aliased = ref_aliases(graph, ran) if ran else {}
    recorded = _recorded_variables(graph) if racy else set()
    chosen, unfetchable, reasons, excluded = [], [], {}, {}
    for op in graph.get_operations():
        if given and len(matched) < len(given):
            matched.update(id(p) for p in given for t in op.outputs if p.search(t.name))
        op_rule = filters.op_rule(op, backward)
        for t in op.outputs:
            if t.name in forced_names or not accountable(t, dtypes):
                continue
            rule = op_rule or filters.tensor_rule(t)
            if rule is not None:
                excluded[t.name] = rule
                continue
            if _why_unfetchable(graph, t) is not None:
                unfetchable.append(t)
                continue
            why = _unsafe_fetch(op.name, aliased, racy, effects, recorded)
            if why:
                unfetchable.append(t)
                reasons[t.name] = why
                continue
            chosen.append(t)
    for p in given:
        if id(p) not in matched:
            log.warning("include/exclude pattern %r matches no tensor name of the graph (names "
                        "look like %s): it selects nothing", p.pattern,
                        _listed([t.name for t in chosen], 3))
    sel = _sort_unfetchable(unfetchable, {t.name for t in chosen} | forced_names)
    sel.reasons.update({n: r for n, r in reasons.items() if n in sel.reasons})
    sel.tensors = chosen + forced
    sel.excluded = excluded
    return sel


def _recorded_variables(graph: tf.Graph) -> set[str]:
    """Names of the variables that get a variable record (``hooks/variables.py``): the trainable
    resource variables. A non-trainable one (a batch norm's moving mean) has none."""
    return {v.op.name for v in graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
            if getattr(getattr(v, "handle", None), "dtype", None) == tf.resource}


def _unsafe_fetch(op: str, aliased: Mapping[str, str], racy: Mapping[str, str],
                  effects: Mapping[str, set[str]], recorded: set[str] = frozenset()) -> str | None:
    """Why fetching an output of ``op`` would record a wrong value or change what training
    does (:func:`ref_aliases`, :func:`unordered_reads`, :func:`side_effects`), or None.
    ``recorded``: the variables with a record (:func:`_recorded_variables`), which holds the
    value the step used; the reason says where that value is, or that nothing holds it."""
    if op in aliased:
        return (f"it shares (or may share) the buffer of {aliased[op]}, a reference variable the "
                "training step updates in place: its recorded value could be the weights after "
                "the update. Resource variables (TF2 behaviour, use_resource=True) have no such "
                "alias")
    if op in racy:
        where = ("the variable's record holds the value the step used" if racy[op] in recorded else
                 "it is not trainable, so it has no variable record: its value is not recorded; "
                 "read it from a checkpoint")
        return (f"it reads {racy[op]}, which the training step writes, off the loss's path: in no "
                "order with the update, its value would be the one before or after it, by chance "
                f"({where})")
    runs = effects.get(op)
    if runs:
        return (f"computing it runs {', '.join(sorted(runs))}, which training does not run (the "
                "loss, UPDATE_OPS and TRAIN_OP do not need it): fetching it would change what "
                "training does")
    return None


def accounting(ops: Iterable[tf.Operation], sel: Selection, captured: Iterable[str],
               filters: Mapping, rest: Rule = UNACCOUNTED) -> dict:
    """The manifest's ``accounting`` (FORMAT.md) of ``ops``' outputs (the saved graph's): each
    float output (or one of ``filters["dtypes"]``) captured (``captured``: the catalog's
    names), skipped or excluded as ``sel`` says; ``rest``: the rule of the outputs it does not
    name (ops made after the selection; outside a Keras trace's region)."""
    dtypes = tuple(filters.get("dtypes") or FLOAT_DTYPES)
    outputs = [(t.name, op.type) for op in ops for t in op.outputs if accountable(t, dtypes)]
    custom = None if set(dtypes) == set(FLOAT_DTYPES) else [d.name for d in dtypes]
    rules = [*DEFAULT_RULES,
             *user_rules(filters.get("include"), filters.get("exclude"), filters.get("op_types"),
                         filters.get("exclude_op_types"), custom)]
    skipped = {n: sel.reasons.get(n, "cannot be fetched") for n in sel.skipped}
    return record(outputs, captured, sel.aliases, skipped, sel.excluded, rules, rest)


def _listed(names: Sequence[str], most: int = 20) -> str:
    return ", ".join(names[:most]) + (" ..." if len(names) > most else "")


def log_unfetchable(sel: Selection) -> None:
    """Log the skipped tensors once per reason, and the TF2 cond outputs captured as their
    Identity."""
    by_reason: dict[str, list[str]] = {}
    for name in sel.skipped:
        # one line per kind of reason, not per variable read (the manifest keeps each in full)
        why = reason_kind(sel.reasons.get(name, "cannot be fetched"))
        by_reason.setdefault(why, []).append(name)
    for why, names in by_reason.items():
        log.info("skipping %d tensors (%s): %s", len(names), why, _listed(names))
    if sel.aliases:
        log.info("%d TF2 cond outputs, not fetchable, are captured as the Identity tf.cond "
                 "returned: %s",
                 len(sel.aliases), _listed([f"{k} as {v}" for k, v in sel.aliases.items()]))


def icnn_roles(graph: tf.Graph) -> dict[str, tuple[str, str]]:
    """tensor name -> (layer, role) from the ICNN layer's registrations."""
    out = {}
    for entry in graph.get_collection(ICNN_COLLECTION):
        layer, role, name = parse_icnn_entry(entry)
        out[name] = (layer, role)
    return out


def icnn_fields(graph: tf.Graph) -> dict[str, dict]:
    """tensor name -> the catalog fields its ICNN registration carries (a multi-class layer's
    ``icnn_filter_class`` on ``class_positive``; {} for the other roles)."""
    return {parse_icnn_entry(e)[2]: icnn_catalog_fields(e)
            for e in graph.get_collection(ICNN_COLLECTION)}


def function_body_tensors(ops: Iterable[tf.Operation], *, include=None, exclude=None,
                          op_types: Iterable[str] | None = None,
                          exclude_op_types: Iterable[str] | None = None,
                          dtypes: Sequence[tf.DType] = FLOAT_DTYPES) -> list[str]:
    """``<op>/<attribute>/<tensor>`` for each output computed inside the functions that ``ops``
    (TF2 loops, conds, function calls) run, nested ones included, that the filters would
    select: what the capture cannot fetch, to list as skipped, so that the manifest never
    claims a complete capture where, say, a Keras LSTM's gates (its while loop's body, or under
    tf.keras 2.15 a function holding the loop) were left out."""
    inc, exc = compile_patterns(include), \
        compile_patterns(exclude) + compile_patterns(DEFAULT_EXCLUDE)
    # arguments come from outside
    skip = DEFAULT_EXCLUDE_OP_TYPES | set(exclude_op_types or ()) | {"Placeholder"}
    names = _inside(ops, tuple(dtypes), set(op_types or ()), skip)
    return [n for n in names
            if (not inc or any(p.search(n) for p in inc)) and not any(p.search(n) for p in exc)]


def _inside(ops: Iterable[tf.Operation], dtypes: tuple, types: set[str],
            skip: frozenset[str]) -> list[str]:
    """:func:`function_body_tensors` before the name filters."""
    out: list[str] = []
    for op in ops:
        for prefix, body in _functions_of(op):
            inner = body.get_operations()
            out += [f"{prefix}/{t.name}" for o in inner
                    if o.type not in skip and (not types or o.type in types)
                    for t in o.outputs if t.dtype.base_dtype in dtypes]
            out += [f"{prefix}/{n}" for n in _inside(inner, dtypes, types, skip)]
    return out
