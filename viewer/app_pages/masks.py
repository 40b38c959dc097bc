"""Page: ICNN masks and templates. First the evidence that a filter is a part detector: its
post-mask map over every kept positive and negative sample's input image with mu marked, side by
side; then one section at a time (``?mt_section=``): mu of positives vs negatives, every filter's
mu spread with n and the negatives' spread beside the positives' (dead filters, never firing in
the dump, flagged in the picker and the table and left unjudged); beta and filter loss over steps;
or the T_mu template grid (which depends only on beta and the map size) with the negative
template.

A multi-class layer (catalog ``icnn_filter_class``, ICNN.md "Several classes") gets a class
chooser: the page then shows only that class's filters, and its positives are the samples
the layer counted as that class's (its dumped ``class_positive``), every other sample negative."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from inspector import analysis
from inspector.analysis import localization as part_filters
from inspector.icnn import templates

from .. import data
from ..dumped_maps import map_tensors, model_input, sample_label, why_no_input
from ..dumps import dump_step_picker
from ..ui import Ctx, need, plain, plots, show_cached_figure

#: The sections under the localization, one drawn at a time (the picker above them chooses): a
#: visit renders the evidence and the verdict, not every figure (the browser's time to draw a
#: page grows with its elements)
SECTIONS = ("mu spread and filters", "beta and filter loss", "Templates T_mu")


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
    from the catalog; None for a single-class layer (or a run written before classes were
    recorded)."""
    name = roles.get("class_positive")
    if not isinstance(name, str) or name not in run.tensors.index:
        return None
    row = run.tensors.loc[name]
    fc, shape = row.get("icnn_filter_class"), row.get("shape")
    if not isinstance(fc, list) or not shape or len(shape) != 2 or not isinstance(shape[1], int):
        return None
    return np.asarray(fc, np.int64), int(shape[1])


def class_groups(ctx: Ctx, roles: pd.Series, step: int, k: int,
                 n: int) -> tuple[np.ndarray | None, str]:
    """Per dumped sample of ``step``, 'positive' if the layer counted it as class ``k``'s, else
    'negative' (ICNN.md: every other image is a negative of class k); (None, why) where the dump
    cannot say."""
    name = roles["class_positive"]
    if f"forward/{name}" not in set(data.dump_keys(ctx.path, ctx.sig, step)):
        return None, f"the dump of step {step} lacks {plain(name)}, the layer's class labels"
    cp = data.dumped(ctx.path, ctx.sig, name, step)
    if cp.ndim != 2 or cp.shape[0] != n or k >= cp.shape[1] or not np.isin(cp, (0.0, 1.0)).all():
        return None, (f"{plain(name)} at step {step} has shape {plain(list(cp.shape))} (want "
                      f"[{n}, > {k}] of 0/1 values, one row per dumped sample)")
    return np.where(cp[:, k] == 1.0, "positive", "negative"), ""


def render(ctx: Ctx) -> None:
    st.header("Masks & templates")
    run = data.get_run(ctx.path, ctx.sig)
    layers = data.icnn_layers(ctx.path, ctx.sig)
    if not need(not layers.empty, "This run has no ICNN mask layer (no tensor in the catalog has "
                                  "an ICNN role)."):
        return
    c = st.columns(3)
    layer = c[0].selectbox("ICNN layer", list(layers.index), key="mt_layer", bind="query-params")
    roles: pd.Series = layers.loc[layer]
    if not need(len(run.steps) > 0, "No full dumps: templates need mu and beta from a dump step."):
        return
    classes = class_filters(run, roles)
    klass = None
    if classes is not None:
        # Plain class ids: the URL holds the shown value (?mt_class=2).
        klass = st.selectbox("Class", range(classes[1]), key="mt_class", bind="query-params",
                             help="The filter slice of one class: its positives are the samples of "
                                  "that class, its negatives every other sample (ICNN.md, 'Several "
                                  "classes').")
    step = dump_step_picker(ctx, "Dump step", "mt_step", container=c[1])
    mu_name, beta_name = roles.get("mu"), roles.get("beta")
    keys = set(data.dump_keys(ctx.path, ctx.sig, step))
    if not need(isinstance(mu_name, str) and f"forward/{mu_name}" in keys,
                f"The dump of step {step} has no mu."):
        return
    mu = data.dumped(ctx.path, ctx.sig, mu_name, step)                       # [N, C, 2]
    pre_shape = run.tensors.loc[roles["pre_mask"], "shape"] \
        if isinstance(roles.get("pre_mask"), str) else None
    h, w = (pre_shape[1], pre_shape[2]) if pre_shape and len(pre_shape) == 4 else (8, 8)
    dead = dead_at(ctx, roles, step, mu)
    ids = list(range(mu.shape[1])) if classes is None \
        else [int(f) for f in np.flatnonzero(classes[0] == klass)]
    if not need(bool(ids), f"Class {klass} has no filter in {plain(layer)} (its filter_class "
                           "assigns none)."):
        return
    if classes is not None:
        st.caption(f"Class {klass} of {classes[1]}: filters {', '.join(map(str, ids))}"
                   + (f"; {int((classes[0] < 0).sum())} filter(s) of no class (not part filters)"
                      if (classes[0] < 0).any() else "") + ".")
    filt = c[2].selectbox("Filter", ids, key="mt_filter", bind="query-params",
                          format_func=lambda f: f"{f} (dead)" if dead[f] else str(f),
                          help="(dead): zero in every dumped sample of this step")
    samples = data.samples(ctx.path, ctx.sig, step, mu_name)
    have_split = False      # a class split read from this step's dump
    if klass is not None:
        split, why = class_groups(ctx, roles, step, klass, len(samples))
        have_split = split is not None
        if split is None:
            st.warning(f"No positive/negative split for class {klass}: {why}. Groups below are "
                       "left empty rather than guessed from the hook's own groups.")
            split = np.full(len(samples), "unknown")
        samples = samples.assign(group=split)
    what = f"{layer} filter {filt}" + (f" (class {klass})" if klass is not None else "")
    groups_now = data.sample_groups(samples, "kept")

    st.subheader(f"Where filter {filt} fires: every kept sample"
                 + ("" if klass is None else f" (class {klass})"))
    localization(ctx, run, roles, step, samples, groups_now, mu, filt, what, bool(dead[filt]))

    section = st.radio("Below", SECTIONS, horizontal=True, key="mt_section", bind="query-params",
                       label_visibility="collapsed")
    if section == SECTIONS[0]:
        mu_section(ctx, roles, layer, klass, step, mu, dead, ids, filt, what, have_split)
    elif section == SECTIONS[1]:
        beta_section(ctx, roles, layer, klass, ids, filt)
    else:
        beta_all = (data.dumped(ctx.path, ctx.sig, beta_name, step)
                    if isinstance(beta_name, str) and f"forward/{beta_name}" in keys else None)
        st.subheader("Templates T_mu: the mask's shape for each position of mu")
        template_section(samples, mu, beta_all, filt, h, w, layer, what, step)


def mu_section(ctx: Ctx, roles: pd.Series, layer: str, klass: int | None, step: int, mu: np.ndarray,
               dead: np.ndarray, ids: list[int], filt: int, what: str, have_split: bool) -> None:
    """mu of positives vs negatives for the filter, its spreads with n, and every filter's table
    and verdict: at ``step``, or over every dump step."""
    st.subheader("mu of positive vs negative samples"
                 + ("" if klass is None else f" (class {klass})"))
    pool = st.toggle("Pool every dump step", value=True, key="mt_pool",
                     help="the scatter, the spreads and the filter table over the samples of every "
                          "dump step (off: the chosen step's only, often too few to judge)")
    mu_all, groups_all, peaks = pooled_mu(ctx, roles, roles["mu"], klass, step, pool, mu.shape[1])
    pts = {g: mu_all[groups_all == g][:, filt] for g in ("positive", "negative")}
    where = "all dump steps" if pool else f"step {step}"
    show_cached_figure(lambda: plots.mu_scatter(pts, f"{what}: mu ({where})", jitter=0.02),
                       ("mt_scatter", ctx.path, ctx.sig, layer, klass, filt, pool,
                        None if pool else step),
                       f"mu_scatter_{layer}_f{filt}", key="mt_scatter")
    if have_split and not len(pts["positive"]):
        st.info(f"No dumped sample is a positive of class {klass} here: the hook keeps samples by "
                f"its own groups, and none of those kept is of class {klass}. Its positive mu "
                "spread cannot be shown.")
    table = filter_spread(mu_all, groups_all, dead, ids, peaks)
    if dead[filt]:
        st.warning(f"Filter {filt} is dead at step {step}: zero in every dumped sample, mu pinned "
                   "at (-1, -1). Its mu spread says nothing about a part, so it is left out of "
                   "the judgement.")
    else:
        st.caption(f"Filter {filt} ({where}): " + spread_text(table.set_index("filter").loc[filt]))
    filter_table(table, step, where)


def beta_section(ctx: Ctx, roles: pd.Series, layer: str, klass: int | None, ids: list[int],
                 filt: int) -> None:
    """beta and the filter loss of the class's filters over the dump steps (min / mean / max over
    filters from the statistics where fewer than two dumps hold them)."""
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
            title=f"{layer}: per filter{'' if klass is None else f' of class {klass}'} (filter "
                  f"{filt} bold)"),
            ("mt_beta", ctx.path, ctx.sig, layer, klass, filt), f"beta_loss_{layer}", key="mt_beta")


def template_section(samples: pd.DataFrame, mu: np.ndarray, beta_all: np.ndarray | None, filt: int,
                     h: int, w: int, layer: str, what: str, step: int) -> None:
    """The T_mu grid (one template per position of mu: the same for every filter of one beta)
    with the chosen sample's mu outlined, and the negative template."""
    sample = st.selectbox("Sample", range(len(samples)),
                          format_func=lambda i: sample_label(samples, i), key="mt_sample",
                          help="its mu is outlined on the grid")
    beta = float(beta_all[filt]) if beta_all is not None else 2.0
    cell = tuple(int(v) for v in analysis.mu_to_cell(mu[sample, filt], h, w))
    label = f"sample #{sample} ({data.sample_groups(samples, 'ungrouped')[sample]}): mu cell {cell}"
    title = f"{what}, step {step}, beta={beta:.3f}"
    # The figure is a function of exactly these values: they are its cache key.
    show_cached_figure(lambda: plots.templates_grid(
        # tile (i, j): mu at cell (i, j)
        templates.positive_templates(h, w, beta).reshape(h, w, h, w),
        templates.negative_template(h, w), {label: cell},
        tau=templates.paper_tau(h, w), title=title),
        ("mt_templates", h, w, beta, label, cell, title), f"templates_{layer}_f{filt}_{step}",
        key="mt_templates")
    st.caption(f"Sample #{sample}: mu = ({mu[sample, filt, 0]:+.3f}, {mu[sample, filt, 1]:+.3f}) "
               f"-> template cell {cell} (outlined). beta = "
               f"{beta:.3f}{'' if beta_all is not None else ' (default; not dumped)'}. The grid "
               "depends only on beta and the map size, not on what the filter learned.")


def localization(ctx: Ctx, run, roles: pd.Series, step: int, samples: pd.DataFrame,
                 groups: np.ndarray, mu: np.ndarray, filt: int, what: str, dead: bool) -> None:
    """Filter ``filt``'s post-mask map over each kept sample's input image, mu marked, positives and
    negatives side by side: does the filter fire on the same part in every positive?"""
    keys = set(data.dump_keys(ctx.path, ctx.sig, step))
    name = next((roles.get(r) for r in ("post_mask", "pre_mask") if isinstance(roles.get(r), str)
                 and f"forward/{roles.get(r)}" in keys), None)
    if not need(name is not None, f"The dump of step {step} holds neither the post-mask nor the "
                                  "pre-mask map."):
        return
    maps = data.dumped(ctx.path, ctx.sig, name, step)
    if not need(maps.ndim == 4 and len(maps) == len(samples) == len(mu),
                f"{plain(name)} at step {step} has shape {plain(list(maps.shape))}, not one [H, W, "
                f"C] map per kept sample ({len(samples)}): nothing to draw."):
        return
    cat = run.tensors
    image_name = model_input(cat, map_tensors(cat, keys))
    images = data.dumped(ctx.path, ctx.sig, image_name, step) if image_name else None
    if images is not None and len(images) != len(samples):
        images = None
    if images is None:
        st.info(why_no_input(cat, step) if image_name is None else
                f"The model input {plain(image_name)} does not have one row per kept sample at "
                f"step {step}: the maps are drawn alone.")
    h, w = maps.shape[1:3]
    order = [g for g in ("positive", "negative") if g in set(groups)] + \
        [g for g in dict.fromkeys(groups) if g not in ("positive", "negative")]
    panels = {g: [{"label": f"#{i} peak {float(np.nanmax(maps[i, ..., filt])):.2g}",
                   "image": None if images is None else images[i], "map": maps[i, ..., filt],
                   "mu_cell": tuple(int(v) for v in analysis.mu_to_cell(mu[i, filt], h, w))}
                  for i in np.flatnonzero(groups == g)] for g in order}
    role = "post-mask" if name == roles.get("post_mask") else "pre-mask"
    show_cached_figure(lambda: plots.localization_grid(
        panels, f"{what}, step {step}: {role} map over the input (+ = mu)"),
        ("mt_local", ctx.path, ctx.sig, name, image_name if images is not None else None, step,
         filt, what, tuple(groups)), f"localization_{name}_f{filt}_{step}", key="mt_local")
    counts = ", ".join(f"{len(v)} {g}" for g, v in panels.items())
    st.caption(f"{counts} kept sample(s). Each tile: the sample's input image with filter {filt}'s "
               f"{role} map ({h}x{w}) enlarged onto it, opaque where the filter fires (one scale "
               "for every sample); + marks mu, the place the mask centres on. A part filter fires "
               "at the same place of the object in every positive and little in the negatives."
               + (" This filter is dead at this step: every map is zero." if dead else ""))


def pooled_mu(ctx: Ctx, roles: pd.Series, mu_name: str, klass: int | None, step: int, pool: bool,
              n_filters: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(mu [M, C, 2], each sample's group [M], each sample's peak pre-mask activation [M, C] or
    None where a step's pre-mask map is not dumped) of the kept samples at ``step``, or at every
    readable dump step with ``pool``; steps whose dump cannot split the samples are left out."""
    mus, groups, peaks = [], [], []
    pre = roles.get("pre_mask")
    for s in (data.readable_steps(ctx.path, ctx.sig) if pool else [step]):
        if f"forward/{mu_name}" not in set(data.dump_keys(ctx.path, ctx.sig, s)):
            continue
        kept = data.samples(ctx.path, ctx.sig, s, mu_name)
        g = data.sample_groups(kept) if klass is None \
            else class_groups(ctx, roles, s, klass, len(kept))[0]
        if g is None:
            continue
        mus.append(data.dumped(ctx.path, ctx.sig, mu_name, s))
        groups.append(np.asarray(g).astype(str))
        peaks.append(data.peaks(ctx.path, ctx.sig, pre, s)
                     if isinstance(pre, str) and f"forward/{pre}" in set(data.dump_keys(
                         ctx.path, ctx.sig, s)) else None)
    if not mus:
        return np.zeros((0, n_filters, 2)), np.zeros(0, str), None
    every = None if any(p is None for p in peaks) else np.concatenate(peaks)
    return np.concatenate(mus), np.concatenate(groups), every


def dead_at(ctx: Ctx, roles: pd.Series, step: int, mu: np.ndarray) -> np.ndarray:
    """Dead filters [C] of the layer at ``step``: from its pre-mask map if dumped, else from mu."""
    name = roles.get("pre_mask")
    if isinstance(name, str) and f"forward/{name}" in set(data.dump_keys(ctx.path, ctx.sig, step)):
        return templates.dead_filters(pre_mask=data.dumped(ctx.path, ctx.sig, name, step))
    return templates.dead_filters(mu=mu)


def filter_spread(mu: np.ndarray, groups: np.ndarray, dead: np.ndarray,
                  filters: list[int] | None = None, peaks: np.ndarray | None = None
                  ) -> pd.DataFrame:
    """Per filter (all, or those in ``filters``): dead, and for positives and negatives the number
    of samples and the mean distance of their mu to its centre (:func:`templates.mu_spread`; NaN
    for dead filters: no part, so no tightness), the positives' spread over the negatives' with
    its bootstrap interval, whether it fires as strongly on negatives (from ``peaks`` [N, C]),
    and the verdict (:func:`inspector.analysis.localization.judge`)."""
    ids = list(range(len(dead))) if filters is None else list(filters)
    out: dict[str, object] = {"filter": np.asarray(ids, np.int64), "dead": dead[ids]}
    for g in ("positive", "negative"):
        m = mu[groups == g][:, ids] if len(mu) else np.zeros((0, len(ids), 2))
        out[f"{g} n"] = np.full(len(ids), len(m), np.int64)
        out[f"{g} mu spread"] = np.where(dead[ids], np.nan,
                                         templates.mu_spread(m) if len(m) else np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["positive / negative"] = np.asarray(out["positive mu spread"]) \
            / np.asarray(out["negative mu spread"])
    judged = part_filters.judge(mu[:, ids] if len(mu) else np.zeros((0, len(ids), 2)), groups,
                                None if peaks is None else peaks[:, ids], dead[ids])
    for c in ("ratio low", "ratio high", "fires on negatives", "localized"):
        out[c] = judged[c].to_numpy()
    return pd.DataFrame(out)


#: fewer samples of a group than this: a spread is an anecdote, not a measurement, and the
#: verdict says "not enough samples"
MIN_SAMPLES = part_filters.MIN_SAMPLES


def spread_text(row: pd.Series) -> str:
    """One filter's spreads with their n, positives beside negatives.

    >>> spread_text(pd.Series({"positive mu spread": 0.1, "positive n": 4,
    ...                        "negative mu spread": 0.5, "negative n": 4,
    ...                        "positive / negative": 0.2}))
    'positives 0.100 (n=4) vs negatives 0.500 (n=4), ratio 0.20'
    """
    def one(g: str) -> str:
        v = row[f"{g} mu spread"]
        return f"{g}s {'-' if pd.isna(v) else f'{v:.3f}'} (n={int(row[f'{g} n'])})"
    ratio = row["positive / negative"]
    return f"{one('positive')} vs {one('negative')}" \
        + ("" if pd.isna(ratio) else f", ratio {ratio:.2f}")


def verdict(table: pd.DataFrame, where: str = "") -> str:
    """How many live filters are localized (interval below 1, not firing as strongly on
    negatives), with n; then the tightest of those judged, each beside its negatives' spread and
    its interval; "not enough samples" below :data:`MIN_SAMPLES` of a group."""
    live = table[~table["dead"]].dropna(subset=["positive mu spread"])
    if live.empty:
        return "no live filter to judge (no positive sample, or every filter dead)"
    out = part_filters.verdict_text(live.rename(columns={"positive / negative": "ratio"}),
                                    where or "these samples") + "."
    judged = live[live["localized"].notna()]
    if judged.empty:
        return out + (" Pool the dump steps, or dump more samples (DumpHook samples_per_group).")
    best = judged.nsmallest(3, "positive mu spread")
    parts = [f"{int(r['filter'])}: {spread_text(r)} [{r['ratio low']:.2f}, {r['ratio high']:.2f}]"
             for _, r in best.iterrows()]
    return out + (" Tightest live filters by the positives' mu spread (mean distance of mu to "
                  f"its centre, map units [-1, 1]; ratio [95% interval]): {'; '.join(parts)}.")


def filter_table(table: pd.DataFrame, step: int, where: str) -> None:
    """The verdict (it judges the live filters only), dead ones named; every filter's row in a
    table on demand (``?mt_table=true``: a grid is the costliest element a page can draw)."""
    st.subheader("Filters" + ("" if where.startswith("step") else f" ({where})"))
    dead_ids = [int(f) for f in table.loc[table["dead"], "filter"]]
    st.caption(f"{len(dead_ids)} dead filter(s) at step {step}"
               + (f": {', '.join(map(str, dead_ids))} (zero in every dumped sample; left out of "
                  "the judgement)"
                  if dead_ids else "") + f"; {verdict(table, where)}")
    if st.toggle("Every filter's row", key="mt_table", bind="query-params",
                 help="a table of every filter: dead, n and mu spread per group, the ratio with "
                      "its 95% interval, fires on negatives, localized"):
        st.dataframe(table, hide_index=True, width="stretch")
