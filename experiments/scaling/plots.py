"""The figures of a scaling study, each one PNG in the sweep directory.

isoflop.png   loss vs N per IsoFLOP budget, with the approach-2 parabolas and their minima
optimal.png   N_opt(C) and D_opt(C): approach-2 minima, their power laws, approach 3's line
frontier.png  Kaplan: best loss vs N with L(N), and every run's loss curve vs FLOPs with the
              lower envelope and L(C)
contours.png  the fitted L(N, D) as contours, the runs on top, the compute-optimal path
ablation.png  (experiments.scaling.ablation) every grid's IsoFLOP minima and N_opt ~ C^a
"""

import os
import textwrap

import matplotlib

matplotlib.use("Agg")  # files only; no display on clusters or CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiments.scaling import fit  # noqa: E402

_LOSS = "final eval loss (nats/token)"


def _params_label(runs):
  return "parameters N (total)" if runs.get("params") == "total" else \
      "parameters N (non-embedding)"


def _budget_colors(budgets):
  cmap = plt.get_cmap("viridis")
  return {b: cmap(i / max(len(budgets) - 1, 1) * 0.9) for i, b in enumerate(budgets)}


def _two_three_five(value, _):
  return f"{value:.3g}" if f"{value:.0e}"[0] in "235" else ""


def _two_and_five(value, _):
  mantissa, exponent = f"{value:.0e}".split("e")
  return f"{mantissa}e{int(exponent)}" if mantissa in ("2", "5") else ""


def _tidy_log_axes(fig):
  """Plain numbers on loss axes; no minor-tick labels where a decade mark is in view.

  Matplotlib's defaults print 3x10^0 on a narrow loss axis and crowd minor labels like
  2x10^8 3x10^8 into each other on a wide FLOPs axis.
  """
  plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.3g}")
  for ax in fig.axes:
    for axis, lim, label in ((ax.xaxis, ax.get_xlim(), ax.get_xlabel()),
                             (ax.yaxis, ax.get_ylim(), ax.get_ylabel())):
      if axis.get_scale() != "log":
        continue
      if "loss" in label and lim[1] / lim[0] < 3:
        # Less than half a decade holds one or two log ticks; evenly spaced ones read better.
        axis.set_major_locator(matplotlib.ticker.MaxNLocator(6))
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
      elif "loss" in label:
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(matplotlib.ticker.FuncFormatter(_two_three_five))
      else:
        decades = np.floor(np.log10(lim[1])) - np.ceil(np.log10(lim[0])) + 1
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter() if decades >= 2 else
                                 matplotlib.ticker.FuncFormatter(_two_and_five))


def _save(fig, path):
  _tidy_log_axes(fig)
  fig.savefig(path, dpi=130, bbox_inches="tight")
  plt.close(fig)
  return path


def plot_isoflop(path, runs, iso, excluded=None):
  fig, ax = plt.subplots(figsize=(7, 4.8))
  budgets = np.unique(runs["budget"])
  colors = _budget_colors(budgets)
  if excluded is not None and len(excluded["N"]):
    for b in np.unique(excluded["budget"]):
      sel = excluded["budget"] == b
      ax.plot(excluded["N"][sel], excluded["L"][sel], "o", mfc="none",
              mec=colors.get(b, "gray"), mew=1.2)
    ax.plot([], [], "o", mfc="none", mec="gray", label="left out of the fits")
  curves = {c["C"]: c for c in iso.get("curves", []) if "coef" in c}
  for b in budgets:
    sel = runs["budget"] == b
    sizes = np.unique(runs["N"][sel])
    # Seeds: the mean, with the standard deviation over seeds as the error bar.
    mean = np.array([runs["L"][sel][runs["N"][sel] == n].mean() for n in sizes])
    std = np.array([runs["L"][sel][runs["N"][sel] == n].std(ddof=1)
                    if (runs["N"][sel] == n).sum() > 1 else 0.0 for n in sizes])
    ax.errorbar(sizes, mean, yerr=std, fmt="o", color=colors[b], ms=5, capsize=2,
                label=f"C = {b:.2g} FLOPs".replace("e+", "e"))
    if b in curves:
      c = curves[b]
      pts = c.get("points") or runs["N"][sel]
      x = np.linspace(np.log10(min(pts)) - 0.1, np.log10(max(pts)) + 0.1)
      ax.plot(10 ** x, np.polyval(c["coef"], x), "-", color=colors[b], lw=1.2)
      if c.get("inside"):
        ci = c.get("ci", {}).get("N_opt")
        if ci and None not in ci and np.all(np.isfinite(ci)):
          ax.errorbar([c["N_opt"]], [c["L_opt"]],
                      xerr=[[max(c["N_opt"] - ci[0], 0)], [max(ci[1] - c["N_opt"], 0)]],
                      fmt="none",
                      ecolor=colors[b], elinewidth=2, capsize=4)
        ax.plot(c["N_opt"], c["L_opt"], "*", color=colors[b], ms=14, mec="black", mew=0.6)
  ax.plot([], [], "*", color="gray", ms=12, mec="black", mew=0.6,
          label="local parabola minimum, 95% interval")
  ax.set(xscale="log", xlabel=_params_label(runs), ylabel=_LOSS, title="IsoFLOP curves")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
  return _save(fig, path)


# Hoffmann et al. 2022, eq. 10 (approach 3): the published Chinchilla law, for reference.
CHINCHILLA = dict(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)


def _errorbar(ax, xs, ys, cis, **kwargs):
  """Points with their 95% intervals; a point without one (None or NaN ends) gets no bar."""
  err = np.nan_to_num(np.array([ci or [y, y] for ci, y in zip(cis, ys)], dtype=float), nan=0.0)
  ax.errorbar(xs, ys, yerr=[np.maximum(ys - err[:, 0], 0), np.maximum(err[:, 1] - ys, 0)],
              fmt="o", capsize=3, **kwargs)


def plot_optimal(path, iso, chin, chin_fixed=None, E_star=None):
  fig, axes = plt.subplots(1, 2, figsize=(11, 4.3))
  curves = iso.get("curves", [])
  cs = np.array([c["C"] for c in curves])
  c_line = np.geomspace(cs.min() / 3, cs.max() * 3) if len(cs) else None
  if c_line is None and "optimal" in chin:
    opt = [o["C"] for o in chin["optimal"]]
    c_line = np.geomspace(min(opt) / 3, max(opt) * 3)
  for ax, key, exp, coef, what in ((axes[0], "N_opt", "a", "N_coef", "parameters"),
                                   (axes[1], "D_opt", "b", "D_coef", "tokens")):
    inside = [c for c in curves if c.get("inside") and key in c and  # as fit._power_laws
              c.get("sizes_left", 1) >= 1 and c.get("sizes_right", 1) >= 1]
    if inside:
      xs = np.array([c.get("C_opt", c["C"]) for c in inside])
      ys = np.array([c[key] for c in inside])
      _errorbar(ax, xs, ys, [c.get("ci", {}).get(key) for c in inside], color="C0",
                label="IsoFLOP minima (approach 2), 95%")
    if exp in iso:
      ax.plot(c_line, iso[coef] * c_line ** iso[exp], "-", color="C0",
              label=f"fit: {key} ∝ C^{iso[exp]:.3f}")
    if np.isfinite(chin.get(exp, np.nan)) and c_line is not None:
      ax.plot(c_line, fit.compute_optimal(chin, c_line)[key], "--", color="C3",
              label=f"L(N, D) fit (approach 3, E free): C^{chin[exp]:.3f}")
    if chin_fixed and np.isfinite(chin_fixed.get(exp, np.nan)) and c_line is not None:
      ax.plot(c_line, fit.compute_optimal(chin_fixed, c_line)[key], ":", color="C2",
              label=f"approach 3, E = E* = {E_star:.3g}: C^{chin_fixed[exp]:.3f}")
    if c_line is not None:
      ax.plot(c_line, fit.compute_optimal(CHINCHILLA, c_line)[key], "-", color="0.6", lw=0.8,
              label=f"Chinchilla (Hoffmann et al. eq. 10): C^"
                    f"{fit._with_exponents(CHINCHILLA)[exp]:.3f}")
    ax.set(xscale="log", yscale="log", xlabel="training compute C (FLOPs)",
           ylabel=f"compute-optimal {what} {key}", title=f"{key} vs compute")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  return _save(fig, path)


def plot_frontier(path, runs, kaplan, frontier):
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
  ax = axes[0]
  ax.plot(runs["N"], runs["L"], "o", color="0.7", ms=4, label="all runs")
  if "alpha_N" in kaplan:
    n = np.array(kaplan["N"])
    ax.plot(n, kaplan["L"], "o", color="C0", label="best loss per size")
    x = np.geomspace(n.min() / 1.5, n.max() * 1.5)
    ax.plot(x, (kaplan["N_c"] / x) ** kaplan["alpha_N"], "-", color="C0",
            label=f"L = (N_c/N)^α_N, α_N = {kaplan['alpha_N']:.3f}")
  ax.set(xscale="log", yscale="log", xlabel=_params_label(runs), ylabel=_LOSS,
         title="Loss vs model size (Kaplan)")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=8)

  ax = axes[1]
  cmap = plt.get_cmap("plasma")
  norm = matplotlib.colors.LogNorm(runs["N"].min(), max(runs["N"].max(), runs["N"].min() * 1.01))
  for n, curve in zip(runs["N"], runs["curves"]):
    ax.plot(curve[:, 0], curve[:, 1], "-", color=cmap(0.85 * norm(n)), lw=0.8, alpha=0.7)
  if "alpha_C" in frontier:
    ax.plot(frontier["C"], frontier["L"], ".", color="black", ms=5, label="lower envelope")
    x = np.geomspace(min(frontier["C"]), max(frontier["C"]))
    ax.plot(x, (frontier["C_c"] / x) ** frontier["alpha_C"], "--", color="black",
            label=f"L = (C_c/C)^α_C, α_C = {frontier['alpha_C']:.3f}")
  # The bar shows the same 85% of the map the curves use.
  bar_cmap = matplotlib.colors.ListedColormap(cmap(np.linspace(0, 0.85, 256)))
  fig.colorbar(plt.cm.ScalarMappable(cmap=bar_cmap, norm=norm), ax=ax,
               label=_params_label(runs))
  metric = {"eval_loss": "eval loss", "loss": "training loss",
            "final_eval_loss": "final eval loss"}.get(frontier.get("metric"), "loss")
  convention = "total" if runs.get("params") == "total" else "non-embedding"
  ax.set(xscale="log", yscale="log", xlabel=f"training compute (FLOPs, {convention} convention)",
         ylabel=f"{metric} (nats/token)", title="Loss vs compute: every run's curve")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  return _save(fig, path)


def plot_contours(path, runs, chin):
  fig, ax = plt.subplots(figsize=(7, 5.2))
  n_lo, n_hi = np.log10(runs["N"].min()) - 0.3, np.log10(runs["N"].max()) + 0.3
  d_lo, d_hi = np.log10(runs["D"].min()) - 0.3, np.log10(runs["D"].max()) + 0.3
  nn, dd = np.meshgrid(np.logspace(n_lo, n_hi, 200), np.logspace(d_lo, d_hi, 200))
  loss = fit.predict_loss(chin, nn, dd)
  # Contours and runs share one color scale, so a run's dot matches the contour it should sit on.
  norm = matplotlib.colors.LogNorm(runs["L"].min(), runs["L"].max())
  levels = np.geomspace(max(loss.min(), runs["L"].min() * 0.97), runs["L"].max() * 1.03, 12)
  cs = ax.contour(nn, dd, loss, levels=levels, cmap="viridis", norm=norm, linewidths=1.0)
  labels = ax.clabel(cs, fontsize=7, fmt="%.2f", inline=False,
                     manual=_label_points(nn, dd, loss, cs.levels))
  for label in labels:
    label.set_bbox(dict(facecolor="white", edgecolor="none", pad=0.5, alpha=0.8))
  sc = ax.scatter(runs["N"], runs["D"], c=runs["L"], cmap="viridis", norm=norm,
                  edgecolors="black", linewidths=0.4, s=40, zorder=3)
  bar = fig.colorbar(sc, ax=ax)
  bar.set_label(_LOSS)  # a colorbar's axis label, so _tidy_log_axes gives it plain numbers
  if np.isfinite(chin["a"]):  # else an exponent is not positive: no compute-optimal path
    c = np.geomspace(6 * 10 ** n_lo * 10 ** d_lo, 6 * 10 ** n_hi * 10 ** d_hi, 200)
    opt = fit.compute_optimal(chin, c)
    ax.plot(opt["N_opt"], opt["D_opt"], "-", color="C3", lw=1.5,
            label=f"compute-optimal path: N ∝ C^{chin['a']:.2f}, D ∝ C^{chin['b']:.2f}")
  ax.set(xscale="log", yscale="log", xlim=(10 ** n_lo, 10 ** n_hi), ylim=(10 ** d_lo, 10 ** d_hi),
         xlabel=_params_label(runs), ylabel="training tokens D",
         title="Fitted L(N, D) = E + A/N^α + B/D^β")
  if ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13))
  return _save(fig, path)


def _label_points(nn, dd, loss, levels):
  """One label per contour, where it crosses a column away from the plot's edges (the
  automatic placement puts some on the border, where they are clipped)."""
  points = []
  rows = loss.shape[0]
  for level in levels:
    for j in (loss.shape[1] * 43 // 100, loss.shape[1] // 4, loss.shape[1] * 4 // 5):
      i = int(np.argmin(np.abs(loss[:, j] - level)))
      if rows // 15 < i < rows - rows // 15 and abs(loss[i, j] - level) < 0.02 * level:
        points.append((nn[i, j], dd[i, j]))
        break
  return points


def plot_ablation(path, table):
  """N_opt against C for every grid of an ablation table: its IsoFLOP minima (filled where
  approach 2's power law uses them, hollow where the minimum lies outside its sizes) with 95%
  intervals, and the power law; the legend gives approach 2's and 3's a."""
  fig, ax = plt.subplots(figsize=(7.5, 4.8))
  for i, row in enumerate(table["rows"]):
    minima, color = row.get("a2_minima") or [], f"C{i}"
    for used in (True, False):
      pts = [m for m in minima if m["in_power_law"] == used]
      if not pts:
        continue
      _errorbar(ax, np.array([m["C"] for m in pts]), np.array([m["N_opt"] for m in pts]),
                [m["ci"] for m in pts], color=color, mfc=color if used else "none", alpha=0.85)
    a2, a3 = row.get("a2"), row.get("a3")
    label = textwrap.fill(
        f"{row['step'].strip()} (N {row['params'].replace('_', '-')}): a = "
        f"{'n/a' if a2 is None else f'{a2:.3f}'} (approach 2), "
        f"{'n/a' if a3 is None else f'{a3:.3f}'} (approach 3)", 110)
    if a2 is not None and row.get("a2_N_coef"):
      cs = np.array([m["C"] for m in minima])
      c_line = np.geomspace(cs.min() / 1.5, cs.max() * 1.5)
      ax.plot(c_line, row["a2_N_coef"] * c_line ** a2, "-", color=color, label=label)
    else:
      ax.plot([], [], "o", color=color, label=label)
  if any(row.get("a2_minima") for row in table["rows"]):  # else nothing to log-scale: n/a
    ax.set(xscale="log", yscale="log")
  ax.set(xlabel="training compute C (FLOPs, each grid's convention)",
         ylabel="compute-optimal parameters N_opt", title="IsoFLOP minima per grid, 95% intervals "
         "(hollow: minimum outside the sizes, not fitted)")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13))
  return _save(fig, path)


def plot_all(workdir: str, runs: dict, result: dict, excluded: dict | None = None) -> list[str]:
  """Every figure the fits allow; a fit that failed only removes its own panels."""
  out = []
  chin, iso = result["chinchilla"], result["isoflop"]
  runs = dict(runs, params=result.get("params"))
  out.append(plot_isoflop(os.path.join(workdir, "isoflop.png"), runs, iso, excluded))
  if "a" in iso or np.isfinite(chin.get("a", np.nan)):
    out.append(plot_optimal(os.path.join(workdir, "optimal.png"), iso, chin,
                            result.get("chinchilla_fixed_E"), result.get("E_star")))
  out.append(plot_frontier(os.path.join(workdir, "frontier.png"), runs, result["kaplan"],
                           result["frontier"]))
  if "alpha" in chin:
    out.append(plot_contours(os.path.join(workdir, "contours.png"), runs, chin))
  return out
