"""NumPy reference of the ICNN conv-mask layer (written from docs/ICNN.md) and the TF harness
that runs ``inspector.icnn.layer.conv_mask`` on constants: shared by tests/test_icnn_*.py."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from inspector.icnn import layer as icnn

tf1 = tf.compat.v1

A = 0.5


# ----------------------------------------------------------------------------- NumPy reference
def ref_mu(x, mode="centroid"):
    """1-based integer (row, col) and sqrtvar per [n, c], as getMu.m."""
    n, h, w, c = x.shape
    mr, mc, sv = np.zeros((n, c)), np.zeros((n, c)), np.zeros((n, c))
    for i in range(n):
        for k in range(c):
            m = x[i, :, :, k]
            tot = max(m.sum(), 1e-9)
            if mode == "centroid":
                r = sum((hh + 1) * m[hh, :].sum() for hh in range(h)) / tot
                q = sum((ww + 1) * m[:, ww].sum() for ww in range(w)) / tot
                r, q = max(np.floor(r + 0.5), 1), max(np.floor(q + 0.5), 1)
            else:  # first maximum in MATLAB's column-major order
                p = int(np.argmax(m.T.ravel()))
                r, q = p % h + 1, p // h + 1
            var = sum(((hh + 1 - r) ** 2 + (ww + 1 - q) ** 2) * m[hh, ww] for hh in range(h) for ww in range(w))
            mr[i, k], mc[i, k], sv[i, k] = r, q, np.sqrt(var / tot)
    return mr, mc, sv


def ref_forward(x, beta, part=None, mode="centroid"):
    n, h, w, c = x.shape
    part = np.ones(c, bool) if part is None else part
    mr, mc, sv = ref_mu(x, mode)
    gy, gx = np.linspace(-1, 1, h), np.linspace(-1, 1, w)
    mu = np.stack([gy[mr.astype(int) - 1], gx[mc.astype(int) - 1]], axis=2)
    m = np.ones_like(x)
    for i in range(n):
        for k in range(c):
            if not part[k]:
                continue
            for hh in range(h):
                for ww in range(w):
                    d = abs(gy[hh] - mu[i, k, 0]) + abs(gx[ww] - mu[i, k, 1])
                    m[i, hh, ww, k] = max(1 - beta[k] * d, -1)
    post = np.maximum(x * m, 0)
    s = (x * m).mean(axis=(1, 2))
    return dict(mu=mu, sqrtvar=sv, mask=m, post=post, strength=s)


def _fix_inf(v):
    v = v.copy()
    fin = np.isfinite(v)
    if np.isinf(v).any():
        v[np.isinf(v)] = v[fin].max() if fin.any() else 0.0
    return v


def ref_filter_grad(x, m, pos, epoch, part=None, w_pos=1.0, w_neg=1.0):
    """The filter-loss term added at x (release scale, per-sample, before any 1/N): one group
    (the release's loop body for one class: its filters ``part``, its positives ``pos``, every
    other image negative, weights ``w_pos`` / ``w_neg``)."""
    n, h, w, c = x.shape
    part = np.ones(c, bool) if part is None else part
    s = (x * m).mean(axis=(1, 2))
    m_flip = m[::-1, :, :, ::-1]
    lzp = _fix_inf(A * np.log(np.mean(np.exp((x * m_flip).mean(axis=(1, 2)) / A), axis=0)))
    lzn = _fix_inf(A * np.log(np.mean(np.exp((-x).mean(axis=(1, 2)) / A), axis=0)))
    mag = max(epoch, 1.0) / 0.1
    d = np.zeros_like(x)
    cols = np.flatnonzero(part)
    for rows, sign in ((np.flatnonzero(pos), -1), (np.flatnonzero(~pos), +1)):
        if rows.size == 0 or cols.size == 0:
            continue
        if sign < 0:
            ss = s[np.ix_(rows, cols)]
            g = np.exp(ss / A) * (ss - lzp[cols] + A)
        else:
            sn = x[rows][..., cols].mean(axis=(1, 2))
            g = np.exp(-sn / A) * (-sn - lzn[cols] + A)
        g = _fix_inf(g)
        g[np.isnan(g)] = 0
        with np.errstate(divide="ignore", invalid="ignore"):
            g = g / (g.mean(axis=0, keepdims=True) * mag)
        g[np.isnan(g)] = 0
        g = _fix_inf(g)
        for a_, i in enumerate(rows):
            for b_, k in enumerate(cols):
                if sign < 0:
                    d[i, :, :, k] -= m[i, :, :, k] * g[a_, b_] * 1e-5 * w_pos
                else:
                    d[i, :, :, k] += g[a_, b_] * 1e-5 * w_neg
    return d


def ref_beta_grad(beta, s, sv, pos, part=None):
    part = np.ones(len(beta), bool) if part is None else part
    out = np.zeros(len(beta))
    for k in np.flatnonzero(part):
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (s[pos, k] * sv[pos, k]).sum() / s[pos, k].sum()
            q = 3.0 / t
        target = 3.0 if np.isnan(q) else min(max(q, 1.5), 3.0)
        out[k] = (beta[k] - target) * 1e4
    return out


# ----------------------------------------------------------------------------- TF harness
def run_layer(x, pos, epoch=2.0, *, beta=None, upstream=None, dtype=np.float64, **kwargs):
    """Build the layer on constants; return role values, dx and d beta for loss = sum(post * U)."""
    n, h, w, c = x.shape
    upstream = np.ones_like(x) if upstream is None else upstream
    g = tf.Graph()
    with g.as_default():
        xt = tf.constant(x.astype(dtype))
        post = icnn.conv_mask(xt, tf.constant(pos), tf.constant(epoch, tf.float32), **kwargs)
        loss = tf.reduce_sum(post * tf.constant(upstream.astype(dtype)))
        (beta_var,) = tf1.get_collection(icnn.BETA_COLLECTION)
        dx, dbeta = tf.gradients(loss, [xt, beta_var])
        roles = {role: t for _, role, t in icnn.registered()}
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            if beta is not None:
                sess.run(beta_var.assign(np.asarray(beta, dtype)))
            vals, dx_v, db_v = sess.run([roles, dx, dbeta])
    return vals, dx_v, db_v


def random_maps(n, h, w, c, seed, zero_frac=0.5):
    rng = np.random.default_rng(seed)
    x = rng.gamma(1.0, 1.0, size=(n, h, w, c))
    x[rng.random(x.shape) < zero_frac] = 0.0   # ReLU-like sparsity
    return x
