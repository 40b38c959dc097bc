"""Page: ICNN masks and templates: the T_mu grid with the chosen samples' mu, the negative
template, beta and filter loss over steps, mu of positive vs negative samples, and every
filter's mu spread with dead filters (never firing in the dump) flagged and left unjudged.

A multi-class layer (catalog ``icnn_filter_class``, ICNN.md "Several classes") gets a class
chooser: the page then shows only that class's filters, and its positives are the samples
the layer counted as that class's (its dumped ``class_positive``), every other sample negative."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from inspector import analysis, plots
from inspector.icnn import templates

from . import data
from .dumps import dump_step_picker
from .featuremaps import sample_label
from .ui import Ctx, need, plain, show_cached_figure


def per_step(ctx: Ctx, name: str | float, steps: list[int]) -> tuple[list[int], np.ndarray]:
    """A non-batched per-channel tensor (beta, filter loss) at every dump step that has it."""
    if not isinstance(name, str):
        return [], np.zeros((0, 0))
    have, vals = [], []
    for s in steps:
        if f"forward/{name}" in set(data.dump_keys(ctx.path, ctx.sig, s)):
            have.append(s)
            vals.append(np.ravel(data.dumped(ctx.path, ctx.sig, name, s)))
    return have, (np.stack(vals) if vals else np.zeros((0, 0)))


def stats_lines(ctx: Ctx, name: str) -> tuple[list[int], np.ndarray]:
    """Fallback without dumps: min, mean, max over channels from the statistics, as 3 lines."""
    df = data.series(ctx.path, ctx.sig, name, "forward", "mean")
    lo = data.series(ctx.path, ctx.sig, name, "forward", "min")
    hi = data.series(ctx.path, ctx.sig, name, "forward", "max")
    if df.empty:
        return [], np.zeros((0, 0))
    return list(df.index), np.stack([lo["all"], df["all"], hi["all"]], 1)


def class_filters(run, roles: pd.Series) -> tuple[np.ndarray, int] | None:
    """(class of each filter [C], -1 off part filters; class count K) of a multi-class layer,
    from the catalog; None for a single-class layer (or a run written before classes were recorded)."""
    name = roles.get("class_positive")
    if not isinstance(name, str) or name not in run.tensors.index:
        return None
    row = run.tensors.loc[name]
    fc, shape = row.get("icnn_filter_class"), row.get("shape")
    if not isinstance(fc, list) or not shape or len(shape) != 2 or not isinstance(shape[1], int):
        return None
    return np.asarray(fc, np.int64), int(shape[1])


def class_groups(ctx: Ctx, roles: pd.Series, step: int, k: int, n: int) -> tuple[np.ndarray | None, str]:
    """Per dumped sample of ``step``, 'positive' if the layer counted it as class ``k``'s, else
    'negative' (ICNN.md: every other image is a negative of class k); (None, why) where the dump
    cannot say."""
    name = roles["class_positive"]
    if f"forward/{name}" not in set(data.dump_keys(ctx.path, ctx.sig, step)):
        return None, f"the dump of step {step} lacks {plain(name)}, the layer's class labels"
    cp = data.dumped(ctx.path, ctx.sig, name, step)
    if cp.ndim != 2 or cp.shape[0] != n or k >= cp.shape[1] or not np.isin(cp, (0.0, 1.0)).all():
        return None, (f"{plain(name)} at step {step} has shape {plain(list(cp.shape))} (want [{n}, > {k}] of 0/1 "
                      "values, one row per dumped sample)")
    return np.where(cp[:, k] == 1.0, "positive", "negative"), ""


def render(ctx: Ctx) -> None:
    st.header("Masks & templates")
    run = data.get_run(ctx.path, ctx.sig)
    layers = data.icnn_layers(ctx.path, ctx.sig)
    if not need(not layers.empty, "This run has no ICNN mask layer (no tensor in the catalog has an ICNN role)."):
        return
    c = st.columns(4)
    layer = c[0].selectbox("ICNN layer", list(layers.index), key="mt_layer", bind="query-params")
    roles: pd.Series = layers.loc[layer]
    if not need(len(run.steps) > 0, "No full dumps: templates need mu and beta from a dump step."):
        return
    classes = class_filters(run, roles)
    klass = None
    if classes is not None:
        # Plain class ids: the URL holds the shown value (?mt_class=2).
        klass = st.selectbox("Class", range(classes[1]), key="mt_class", bind="query-params",
                             help="The filter slice of one class: its positives are the samples of that class, "
                                  "its negatives every other sample (ICNN.md, 'Several classes').")
    step = dump_step_picker(ctx, "Dump step", "mt_step", container=c[1])
    mu_name, beta_name = roles.get("mu"), roles.get("beta")
    keys = set(data.dump_keys(ctx.path, ctx.sig, step))
    if not need(isinstance(mu_name, str) and f"forward/{mu_name}" in keys, f"The dump of step {step} has no mu."):
        return
    mu = data.dumped(ctx.path, ctx.sig, mu_name, step)                       # [N, C, 2]
    pre_shape = run.tensors.loc[roles["pre_mask"], "shape"] if isinstance(roles.get("pre_mask"), str) else None
    h, w = (pre_shape[1], pre_shape[2]) if pre_shape and len(pre_shape) == 4 else (8, 8)
    dead = dead_at(ctx, roles, step, mu)
    ids = list(range(mu.shape[1])) if classes is None else [int(f) for f in np.flatnonzero(classes[0] == klass)]
    if not need(bool(ids), f"Class {klass} has no filter in {plain(layer)} (its filter_class assigns none)."):
        return
    if classes is not None:
        st.caption(f"Class {klass} of {classes[1]}: filters {', '.join(map(str, ids))}"
                   + (f"; {int((classes[0] < 0).sum())} filter(s) of no class (not part filters)"
                      if (classes[0] < 0).any() else "") + ".")
    filt = c[2].selectbox("Filter", ids, key="mt_filter", bind="query-params",
                          format_func=lambda f: f"{f} (dead)" if dead[f] else str(f))
    samples = data.samples(ctx.path, ctx.sig, step, mu_name)
    have_split = False      # a class split read from this step's dump
    if klass is not None:
        split, why = class_groups(ctx, roles, step, klass, len(samples))
        have_split = split is not None
        if split is None:
            st.warning(f"No positive/negative split for class {klass}: {why}. Groups below are left empty "
                       "rather than guessed from the hook's own groups.")
            split = np.full(len(samples), "unknown")
        samples = samples.assign(group=split)
    sample = c[3].selectbox("Sample", range(len(samples)), format_func=lambda i: sample_label(samples, i),
                            key="mt_sample")
    beta_all = (data.dumped(ctx.path, ctx.sig, beta_name, step)
                if isinstance(beta_name, str) and f"forward/{beta_name}" in keys else None)
    beta = float(beta_all[filt]) if beta_all is not None else 2.0

    cell = tuple(int(v) for v in analysis.mu_to_cell(mu[sample, filt], h, w))
    what = f"{layer} filter {filt}" + (f" (class {klass})" if klass is not None else "")
    label = f"sample #{sample} ({data.sample_groups(samples, 'ungrouped')[sample]}): mu cell {cell}"
    title = f"{what}, step {step}, beta={beta:.3f}"
    # The figure is a function of exactly these values: they are its cache key.
    show_cached_figure(lambda: plots.templates_grid(
        templates.positive_templates(h, w, beta).reshape(h, w, h, w),   # tile (i, j): mu at cell (i, j)
        templates.negative_template(h, w), {label: cell}, tau=templates.paper_tau(h, w), title=title),
        ("mt_templates", h, w, beta, label, cell, title), f"templates_{layer}_f{filt}_{step}", key="mt_templates")
    st.caption(f"Sample #{sample}: mu = ({mu[sample, filt, 0]:+.3f}, {mu[sample, filt, 1]:+.3f}) -> template "
               f"cell {cell} (outlined). beta = {beta:.3f}{'' if beta_all is not None else ' (default; not dumped)'}.")

    st.subheader("beta and filter loss over steps")
    panels = {}
    for label, role in (("beta", "beta"), ("filter loss", "filter_loss")):
        s, v = per_step(ctx, roles.get(role), data.readable_steps(ctx.path, ctx.sig))
        if len(s) < 2 and isinstance(roles.get(role), str):
            s, v = stats_lines(ctx, roles[role])
            label += " (min / mean / max over filters, from statistics)"
            if klass is not None:
                label += " (all classes)"
        elif len(s):
            v = v[:, ids]
        if len(s):
            panels[label] = (s, v)
    if need(bool(panels), "beta and filter loss were not captured for this layer."):
        show_cached_figure(lambda: plots.channel_lines(
            panels, highlight=ids.index(filt), channels=ids,
            title=f"{layer}: per filter{'' if klass is None else f' of class {klass}'} (filter {filt} bold)"),
            ("mt_beta", ctx.path, ctx.sig, layer, klass, filt), f"beta_loss_{layer}", key="mt_beta")

    st.subheader("mu of positive vs negative samples" + ("" if klass is None else f" (class {klass})"))
    pool = st.toggle("Pool every dump step", key="mt_pool")
    groups: dict[str, list] = {"positive": [], "negative": []}
    for s in (data.readable_steps(ctx.path, ctx.sig) if pool else [step]):
        if f"forward/{mu_name}" not in set(data.dump_keys(ctx.path, ctx.sig, s)):
            continue
        kept = data.samples(ctx.path, ctx.sig, s, mu_name)
        g = data.sample_groups(kept) if klass is None else class_groups(ctx, roles, s, klass, len(kept))[0]
        if g is None:
            continue
        m = data.dumped(ctx.path, ctx.sig, mu_name, s)[:, filt]
        for name in groups:
            groups[name].append(m[g == name])
    pts = {k: np.concatenate(v) if v else np.zeros((0, 2)) for k, v in groups.items()}
    show_cached_figure(lambda: plots.mu_scatter(pts, f"{what}: mu ({'all dump steps' if pool else f'step {step}'})",
                                                jitter=0.02),
                       ("mt_scatter", ctx.path, ctx.sig, layer, klass, filt, pool, None if pool else step),
                       f"mu_scatter_{layer}_f{filt}", key="mt_scatter")
    if have_split and not len(pts["positive"]):
        st.info(f"No dumped sample is a positive of class {klass} here: the hook keeps samples by its own groups, "
                f"and none of those kept is of class {klass}. Its positive mu spread cannot be shown.")
    if dead[filt]:
        st.warning(f"Filter {filt} is dead at step {step}: zero in every dumped sample, mu pinned at (-1, -1). "
                   f"Its mu spread says nothing about a part, so it is left out of the judgement.")
    else:
        spread = {k: float(np.linalg.norm(v - v.mean(0), axis=1).mean()) for k, v in pts.items() if len(v)}
        st.caption("mean distance of mu to its group centre: "
                   + ", ".join(f"{k} {v:.3f}" for k, v in spread.items())
                   + " (a part filter keeps positives tight)")
    filter_table(mu, data.sample_groups(samples, ""), dead, step, ids)


def dead_at(ctx: Ctx, roles: pd.Series, step: int, mu: np.ndarray) -> np.ndarray:
    """Dead filters [C] of the layer at ``step``: from its pre-mask map if dumped, else from mu."""
    name = roles.get("pre_mask")
    if isinstance(name, str) and f"forward/{name}" in set(data.dump_keys(ctx.path, ctx.sig, step)):
        return templates.dead_filters(pre_mask=data.dumped(ctx.path, ctx.sig, name, step))
    return templates.dead_filters(mu=mu)


def filter_spread(mu: np.ndarray, groups: np.ndarray, dead: np.ndarray,
                  filters: list[int] | None = None) -> pd.DataFrame:
    """Per filter (all, or those in ``filters``): dead, and the mean distance of positives' /
    negatives' mu to their centre (NaN for dead filters: no part, so no tightness)."""
    ids = list(range(mu.shape[1])) if filters is None else list(filters)
    mu, dead = mu[:, ids], dead[ids]
    out = {"filter": np.asarray(ids, np.int64), "dead": dead}
    for g in ("positive", "negative"):
        m = mu[groups == g]
        d = np.linalg.norm(m - m.mean(0), axis=2).mean(0) if len(m) else np.full(mu.shape[1], np.nan)
        out[f"{g} mu spread"] = np.where(dead, np.nan, d)
    return pd.DataFrame(out)


def filter_table(mu: np.ndarray, groups: np.ndarray, dead: np.ndarray, step: int,
                 filters: list[int] | None = None) -> None:
    """Every filter at ``step`` (or those in ``filters``: one class's), dead ones flagged; the
    summary judges the live ones only."""
    st.subheader("Filters at this dump step")
    table = filter_spread(mu, groups, dead, filters)
    st.dataframe(table, hide_index=True, width="stretch")
    best = table[~table["dead"]].dropna(subset=["positive mu spread"]).nsmallest(3, "positive mu spread")
    judged = ("tightest live filters (positive mu spread): "
              + ", ".join(f"{f} ({v:.3f})" for f, v in zip(best["filter"], best["positive mu spread"]))
              if len(best) else "no live filter to judge")
    dead_ids = [int(f) for f in table.loc[table["dead"], "filter"]]
    st.caption(f"{len(dead_ids)} dead filter(s) at step {step}"
               + (f": {', '.join(map(str, dead_ids))} (zero in every dumped sample; left out of the judgement)"
                  if dead_ids else "") + f"; {judged}")
