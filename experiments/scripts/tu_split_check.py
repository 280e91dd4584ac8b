"""How hard are the validation and test parts of a TU dataset's split? A feature baseline.

Fits a logistic regression on simple graph statistics (node count, edges per node, mean and
summed node features) on the training part of the runner's split (the same seeded stratified
80/10/10 split, ``data_seed`` 0) and prints its validation and test accuracy beside the
majority-class rate. Used on the results page to show that PROTEINS' test part is harder than
its validation part for every model, not only the transformers.

    python experiments/scripts/tu_split_check.py --data-root ../shared/data proteins mutag
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("datasets", nargs="+", help="registry names, e.g. proteins mutag")
    p.add_argument("--data-root", required=True)
    p.add_argument("--seed", type=int, default=0, help="split seed (the runner's data_seed)")
    args = p.parse_args()
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from diffusionformer.data import load_dataset

    print("| dataset | train / val / test graphs | majority rate (test) | logistic regression val | test |")
    print("|---|---|---|---|---|")
    for name in args.datasets:
        d = load_dataset(name, root=args.data_root, seed=args.seed)
        ds = d.dataset
        rows = []
        for i in range(len(ds)):
            g = ds[i]
            rows.append(np.concatenate([[g.num_nodes, g.num_edges / max(g.num_nodes, 1)],
                                        g.x.mean(0).numpy(), g.x.sum(0).numpy()]))
        X, y = np.stack(rows), ds.y.numpy()
        tr, va, te = (t.numpy() for t in (d.train_idx, d.val_idx, d.test_idx))
        model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000)).fit(X[tr], y[tr])
        majority = np.bincount(y[tr]).argmax()
        print(f"| {name} | {len(tr)} / {len(va)} / {len(te)} | {np.mean(y[te] == majority):.3f} | "
              f"{model.score(X[va], y[va]):.3f} | {model.score(X[te], y[te]):.3f} |")


if __name__ == "__main__":
    main()
