#!/usr/bin/env python3
"""tools/latent_dense_study.py's simulated nvfp4_ds_mla latent against mlakv's own codec.

Random rows (sizes spread over ~e^+-2 per row and per dim, a block of tiny rows whose group
scales fall into e4m3's subnormals) go through `mlakv codec encode --format nvfp4_ds_mla
--outer-scale S` and `codec decode`; the study's nvfp4() on rows / S, times S, must give the same
floats bit for bit (the study's KLDs stand on it). Usage: latent_dense_study_test.py MLAKV_CLI.
Exits 77 (ctest's skip) without torch, transformers or numpy.
"""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:
    import numpy as np
    import torch
    import transformers  # noqa: F401  (the study module imports it)
    import tokenizers  # noqa: F401
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import latent_dense_study as study  # noqa: E402


def main():
    cli = sys.argv[1]
    g = np.random.default_rng(1)
    rows = np.concatenate([g.standard_normal((200, 576)) * np.exp(g.standard_normal((200, 1))) * 0.3,
                           g.standard_normal((56, 576)) * 1e-3], 0)
    rows[:, :512] *= np.exp(g.standard_normal(512) * 0.5)[None, :]
    rows = rows.astype("<f4")
    for s_l in (np.float32(1.0), np.float32(0.0021)):
        with tempfile.TemporaryDirectory() as tmp:
            src, rec, dec = (os.path.join(tmp, n) for n in ("rows.npy", "rec.bin", "dec.f32"))
            np.save(src, rows)
            subprocess.run([cli, "codec", "encode", "--format", "nvfp4_ds_mla", "--outer-scale", str(float(s_l)),
                            "--in", src, "--out", rec], check=True, capture_output=True)
            subprocess.run([cli, "codec", "decode", "--in", rec, "--out", dec], check=True, capture_output=True)
            got = np.fromfile(dec, dtype="<f4").reshape(-1, 576)[:, :512]
        sim = (study.nvfp4(torch.tensor(rows[:, :512]) / torch.tensor(s_l)) * torch.tensor(s_l)).numpy()
        bad = np.flatnonzero(got.view("<u4") != sim.view("<u4"))
        assert bad.size == 0, (float(s_l), bad[:5], got.ravel()[bad[:5]], sim.ravel()[bad[:5]])
        print(f"s_l {float(s_l)}: {got.size} values bit-identical to mlakv's codec")
    print("ok")


if __name__ == "__main__":
    main()
