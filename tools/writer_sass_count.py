#!/usr/bin/env python3
"""Warp instructions per token along a cache writer kernel's hot path, from its SASS.

The writers are bound by instruction issue (docs/perf.md, "Cache writers"), so the count of
one token's trip through write_cache_kernel's loop is their cost model. This walks the
SASS of one kernel from the loop head (the label before the slot load) back to it, taking
each conditional branch the way the benchmark's tokens take it (f32 input, vector-aligned,
a valid slot, no tally, no token scale; the decisions are keyed on source lines, found by
their text in src/cuda/smxx/cache_writer.cu and src/format/record_codec.h, so the same
rules fit a later commit). BRA.DIV (a diverged warp's path) is not taken; predicated-off
instructions count (they issue). Prints the walk's conditional branches and the counts by
pipe: alu (LOP3, SHF, IADD3, ISETP/FSETP, FMNMX, SEL, PRMT, LEA, ...: half rate), fma
(FFMA/FMUL/FADD/IMAD/HFMA2), mem, ctl.

    nvcc -arch=sm_90a -cubin -lineinfo -O3 -DNDEBUG --expt-relaxed-constexpr -std=c++20 \
         -DMLAKV_CUDA_HAVE_ARCH_90a=1 -Isrc -Iinclude src/cuda/smxx/cache_writer.cu -o w.cubin
    nvdisasm -c -gi w.cubin > w.sass
    tools/writer_sass_count.py w.sass KvFormatE2ELb0ELb1ELb1E . search [pow2|recip] [-v]

KERNEL: a substring of the mangled name (KvFormatE<format>ELb<transform>ELb<vector>ELb<search>E);
KIND: plain (the round-to-nearest kernel), search-main (the search through
nvfp4_group_search_fast, before the screened path), search (the screened path); pow2: s_l a
power of two (the benchmark's 1; folded into the screen), recip: the reciprocal path (a
calibrated s_l, the transform benchmark's). -v prints the whole walk.
"""
import collections
import re
import sys


def main():
    sass, kernel, root, kind = sys.argv[1:5]
    mode = sys.argv[5] if len(sys.argv) > 5 and not sys.argv[5].startswith("-") else "pow2"
    verbose = "-v" in sys.argv
    cw, rc = root + "/src/cuda/smxx/cache_writer.cu", root + "/src/format/record_codec.h"
    text = {cw: open(cw).read().split("\n"), rc: open(rc).read().split("\n")}

    def lines(path, pat):
        return [i + 1 for i, l in enumerate(text[path]) if pat in l]

    def key(path, line):
        return ("cache_writer.cu:%d" if path == cw else "record_codec.h:%d") % line

    rules = {}

    def rule(path, pat, taken, nth=0, optional=False):
        hits = lines(path, pat)
        if not hits:
            if optional:
                return
            sys.exit("pattern not found in %s: %s" % (path, pat))
        rules[key(path, hits[nth])] = taken

    rule(cw, "if (slot < 0) continue;", False)
    rule(cw, "if (slot >= p.num_slots) {", True)
    rule(cw, "  if (bf16) {", True)
    rule(cw, "if (p.tally != nullptr) tally.add", True)
    rule(cw, "t < p.n; t += stride) {", True)
    rule(cw, "if (p.token_scale) {", True, optional=True)
    rule(cw, "if (!kSearch && p.token_scale) {", True, optional=True)
    rule(cw, "if (!tf.rotate) return;", False)
    rule(cw, "if (!tf.rope) return;", False)
    rule(rc, "return __frcp_rn(b);", True)  # __frcp_rn's in-range branch
    pow2 = mode == "pow2"
    if kind == "plain":
        rule(cw, "} else if (s != 0.0f) {", False)
        rule(cw, "        if (fast) {", False)
        rule(cw, "if (!fast) sf_code", True)
        fast = lines(cw, "        if (fast) {")[0]
        branch = [x for x in lines(cw, "if (mode == codec::Nvfp4Fast::kPow2) {") if x > fast][0]
        rules[key(cw, branch)] = pow2
    elif kind == "search-main":
        g = lines(rc, "MLAKV_HD uint8_t nvfp4_group_search_fast(")[0]
        p2 = [x for x in lines(rc, "if (path == DivPath::kPow2) {") if x > g][0]
        rules[key(rc, p2)] = pow2
        if not pow2:
            rules[key(rc, p2 + 2)] = True  # the reciprocal quotient (|x| >= 2^-100)
        rule(rc, "const float sf = c == 0 ? 0.0f : e4m3_to_f32_fast(c);", False)
        rule(rc, "if (c == 0) return mul_rn(a[i], a[i]);", False)
        rule(rc, "if (c0 >= 2) {", False)
        rule(rc, "if (c0 + 1 <= 0x7Eu) {", False)
        for pat in ("return __fmaf_rn(a, b, c);", "return __fmul_rn(a, b);", "return __fadd_rn(a, b);",
                    "return __fsub_rn(a, b);"):  # a <= 2^111: div_rn_by_e4m3, not the IEEE division
            rule(rc, pat, True)
    elif kind == "search":
        rule(cw, "if (mode != codec::Nvfp4Fast::kNone) {", False)
        rule(cw, "if (__all_sync(0xFFFFFFFFu, codec::nvfp4_search_fast_applies", False)
        rule(cw, "if (nl.search_fold) {", pow2)
        rule(cw, "if (mode == codec::Nvfp4Fast::kPow2) {", False)
        rule(rc, "if (!nvfp4_search_decided(em, e0)", False)
        rule(rc, "const float sfc = up ? sf[2]", False)
        rule(cw, "if (c >= 0) {", True)
    else:
        sys.exit("unknown kind " + kind)

    # The kernel's instructions, their source lines (the innermost of each inlining chain)
    # and labels.
    ins, order, src, labels = {}, [], {}, {}
    inside, cur, prev_file, pending = False, "", False, []
    for ln in open(sass).read().split("\n"):
        if ln.startswith("//----") and ".text." in ln:
            inside = kernel in ln
            continue
        if not inside:
            continue
        m = re.match(r'\s*//## File "([^"]+)", line (\d+)', ln)
        if m:
            if not prev_file:
                cur = m.group(1).split("/")[-1] + ":" + m.group(2)
            prev_file = True
            continue
        prev_file = False
        m = re.match(r"^(\.L_x_\d+):", ln)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,5})\*/\s+(.*?)\s*;", ln)
        if m:
            a = int(m.group(1), 16)
            ins[a], src[a] = m.group(2), cur
            order.append(a)
            for l in pending:
                labels[l] = a
            pending = []
    if not order:
        sys.exit("kernel not found: " + kernel)
    nxt = {a: order[i + 1] for i, a in enumerate(order[:-1])}
    start = None
    for a in order:
        if "LDG.E.64 " in ins[a]:
            start = max(v for v in labels.values() if v <= a)
            break

    def target(t):
        m = re.search(r"`\((\.L_x_\d+)\)", t)
        return labels[m.group(1)] if m else int(re.search(r"0x([0-9a-f]+)", t).group(1), 16)

    alu = {"LOP3", "SHF", "IADD3", "ISETP", "FSETP", "FMNMX", "SEL", "FSEL", "PRMT", "LEA", "IMNMX", "VIMNMX",
           "PLOP3", "P2R", "R2P", "FLO", "POPC", "CS2R", "MOV", "FCHK", "BMSK", "SGXT", "BREV", "VIADD"}
    fma = {"FFMA", "FMUL", "FADD", "IMAD", "HFMA2", "HADD2", "HMUL2"}
    mem = {"LDG", "STG", "LDS", "STS", "LDL", "STL", "LDC", "ULDC", "SHFL", "RED", "REDG", "ATOM"}
    count, pipes, pc, steps = collections.Counter(), collections.Counter(), start, 0
    while True:
        steps += 1
        if steps > 100000:
            sys.exit("no way back to the loop head")
        t = ins[pc]
        m = re.match(r"(@!?U?P\w+\s+)?(\S+)\s*(.*)", t)
        pred, op, rest = m.group(1), m.group(2), m.group(3)
        base = op.split(".")[0]
        count[base] += 1
        pipes["alu" if base in alu else "fma" if base in fma else "mem" if base in mem else "ctl/other"] += 1
        cond = op.startswith("BRA") and pred is not None and not op.startswith("BRA.DIV")
        if verbose or cond:
            print("%5x  %-64s %s%s" % (pc, t[:64], src[pc], "   <== branch" if cond else ""))
        if pc == start and steps > 1:
            break
        if op.startswith("BRA.DIV"):  # taken by a diverged warp only
            pc = nxt[pc]
        elif op.startswith("BRA"):
            pc = target(rest) if pred is None or rules.get(src[pc], False) else nxt[pc]
        elif op.startswith("EXIT") and pred is None:
            sys.exit("walked out of the loop: a rule is missing")
        else:
            pc = nxt[pc]  # CALLs are the slow paths: not entered
    total = sum(pipes.values()) - 1  # the loop head was counted twice
    print("total %d per token: %s" % (total, ", ".join("%s %d" % kv for kv in sorted(pipes.items()))))
    print("  " + " ".join("%s=%d" % kv for kv in count.most_common()))


if __name__ == "__main__":
    main()
