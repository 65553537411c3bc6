#!/usr/bin/env python3
"""Compare the SASS of every CUDA kernel in two sets of object files.

For refactors that must not change what the GPU runs (moving kernels between files
and namespaces, replacing literals by named constants): build the objects before and
after, then

    tools/sass_diff.py before/a.cu.o,before/b.cu.o after/x.cu.o,after/y.cu.o [Old=New ...]

Kernels are matched by architecture and demangled signature with the mlakv
namespaces (mlakv::, mlakv::cuda::, ::kernels::, ::sm80::, anonymous) removed, so a
kernel that moved namespace still pairs with its old self; Old=New renames a type in
the "before" signatures (a params struct that was renamed). Instructions are compared
with addresses and encodings stripped. Prints SAME / DIFF / MISSING per kernel and
exits 1 unless every kernel is SAME. Needs cuobjdump (CUDA toolkit) and c++filt.
"""
import collections
import os
import re
import shutil
import subprocess
import sys


def tool(name):
    path = shutil.which(name) or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", name)
    if not os.path.exists(path):
        sys.exit(f"error: {name} not found (put the CUDA toolkit's bin on PATH or set CUDA_HOME)")
    return path


def normalize(signature):
    s = re.sub(r"\(anonymous namespace\)::", "", signature)
    for ns in ("mlakv::cuda::kernels::", "mlakv::cuda::sm80::", "mlakv::cuda::", "mlakv::"):
        s = s.replace(ns, "")
    return s


def kernels(objects, cuobjdump):
    result = collections.OrderedDict()
    for obj in objects:
        out = subprocess.run([cuobjdump, "-sass", obj], capture_output=True, text=True, check=True).stdout
        arch, current = None, None
        for line in out.splitlines():
            m = re.match(r"\s*arch = (sm_\w+)", line)
            if m:
                arch = m.group(1)
                continue
            m = re.match(r"\s*Function : (\S+)", line)
            if m:
                demangled = subprocess.run(["c++filt", m.group(1)], capture_output=True, text=True).stdout.strip()
                current = (arch, normalize(demangled))
                result[current] = []
                continue
            if current and re.search(r"/\*[0-9a-f]{4,}\*/", line):
                result[current].append(re.sub(r"/\*[0-9a-f]+\*/", "", line).split(";")[0].strip())
    return result


def main():
    if len(sys.argv) < 3 or any("=" not in a for a in sys.argv[3:]):
        sys.exit(__doc__)
    cuobjdump = tool("cuobjdump")
    old = kernels(sys.argv[1].split(","), cuobjdump)
    for rename in sys.argv[3:]:
        before, after = rename.split("=", 1)
        old = collections.OrderedDict(
            ((arch, re.sub(rf"\b{re.escape(before)}\b", after, sig)), v) for (arch, sig), v in old.items())
    new = kernels(sys.argv[2].split(","), cuobjdump)
    ok = True
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key), new.get(key)
        if a is None or b is None:
            print(f"MISSING in {'before' if a is None else 'after'}: {key[0]} {key[1]}")
            ok = False
        elif a != b:
            print(f"DIFF    {key[0]} {key[1]} ({len(a)} -> {len(b)} instructions)")
            ok = False
        else:
            print(f"SAME    {key[0]} {key[1]} ({len(a)} instructions)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
