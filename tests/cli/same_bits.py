"""Exit 0 when two receipts agree bit for bit on every loss, norm, batch and tensor hash.

Usage: same_bits.py A.h5 B.h5
"""
import sys

import h5py
import numpy as np

DATASETS = ["steps/loss", "steps/grad_norm", "steps/lr", "steps/batch_hash",
            "hashes/params", "hashes/grads", "hashes/adam_m", "hashes/adam_v"]


def main(a_path, b_path):
    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        for name in DATASETS:
            x, y = a[name][:], b[name][:]
            if x.shape != y.shape or x.tobytes() != y.tobytes():
                diff = np.argwhere(x != y) if x.shape == y.shape else "shape"
                print(f"{name} differs: first at {diff[0] if len(diff) else diff}", file=sys.stderr)
                return 1
    print("bitwise identical:", a_path, b_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
