"""lr_law_interval.py LAW_JSON SD DOF: add the exponent's 95% interval (lr_law.fit_lr_law's
parametric bootstrap with the seed noise SD measured with DOF degrees of freedom) to a
published lr_law.json, refitted from its own per-size losses (the sweep's run directories are
gone), and redraw the plot beside it. The law itself and the tolerance range are refitted
too and must come out as published. Run from the repository root with PYTHONPATH=."""
import json
import os
import sys

import numpy as np

from experiments.scaling import lr_law

path, sd, dof = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
law = json.load(open(path))
per = law["per_size"]
new = lr_law.fit_lr_law([p["N"] for p in per], per, tol=law["tol"], noise_sd=sd, noise_dof=dof)
# Published before this script: the tolerance range under the name exponent_ci95.
old_range = law.get("exponent_tol_range") or law["exponent_ci95"]
assert np.allclose([new["coef"], new["exponent"]], [law["coef"], law["exponent"]])
assert np.allclose(new["exponent_tol_range"], old_range), (new["exponent_tol_range"], old_range)
law.update(exponent_tol_range=new["exponent_tol_range"], exponent_ci95=new["exponent_ci95"],
           noise_sd=sd, noise_dof=dof)
with open(path, "w") as f:
  json.dump(law, f, indent=2)
png = path.replace("lr_law.json", "lr_sweep.png")
lr_law.plot(png, law)
print(f"exponent {law['exponent']:.4f}: 95% {np.round(law['exponent_ci95'], 3).tolist()}, "
      f"optima within {law['tol']} nats {np.round(law['exponent_tol_range'], 3).tolist()}; "
      f"wrote {path} and {os.path.basename(png)}")
