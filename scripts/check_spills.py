#!/usr/bin/env python3
"""Reads the compiled direct-convolution kernels, one object per instruction-set level, and reports the
stack traffic inside their innermost multiply-add loops: a packed vector load, store or operand at
(%rsp) or (%rbp) there is an accumulator or operand the register file could not hold (a spill). Prints a line per level
and loop; exits 1 if any hot loop touches the stack.

    python scripts/check_spills.py [build folder]      # default: the build/temp* folder setup.py used

The kernels' tiles are sized to each level's registers (csrc/engine/conv_direct_kernels.h: TILE_ACC,
DW_OB, DW_CV, DW_KR); this is the check that they still fit after a change or with another compiler.
"""
import glob
import os
import re
import subprocess
import sys

LEVELS = ("sse2", "avx2", "avx512")
INSN = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$")
FUNC = re.compile(r"^[0-9a-f]+ <(.+)>:$")
ARITH = re.compile(r"^v?(fmadd|fnmadd|mulps|addps|vfmadd)")
STACK = re.compile(r"\((%rsp|%rbp)\)|\(%rsp,|\(%rbp,")


def functions(obj):
    """{function: [(address, mnemonic, operands)]} of an object's disassembly."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", obj], capture_output=True, text=True, check=True)
    funcs, current = {}, None
    for line in out.stdout.splitlines():
        m = FUNC.match(line)
        if m:
            current = funcs.setdefault(m.group(1), [])
            continue
        m = INSN.match(line)
        if m and current is not None:
            current.append((int(m.group(1), 16), m.group(2), m.group(3)))
    return funcs


def hot_loops(insns):
    """The innermost loops (a backward jump's span with no other backward jump inside) that multiply-add
    vectors: [(start, end, arithmetic instructions, vector stack accesses)]."""
    loops = []
    for at, op, args in insns:
        if op.startswith("j"):
            m = re.match(r"([0-9a-f]+)", args)
            if m and int(m.group(1), 16) < at:
                loops.append((int(m.group(1), 16), at))
    inner = [(a, b) for a, b in loops if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in loops)]
    found = []
    for a, b in inner:
        body = [(op, args) for at, op, args in insns if a <= at <= b]
        arith = sum(1 for op, args in body if ARITH.match(op) and "mm" in args)
        # packed moves and arithmetic only: a scalar (movss, vbroadcastss) at the stack is an input value
        # carried between iterations, not a vector that did not fit
        spills = sum(1 for op, args in body if "mm" in args and STACK.search(args) and not op.endswith(("ss", "sd")))
        if arith >= 4:
            found.append((a, b, arith, spills))
    return found


def main(argv):
    build = argv[0] if argv else next(iter(sorted(glob.glob("build/temp*"))), None)
    if build is None:
        sys.exit("no build folder: run `python setup.py build_ext --inplace` first, or name one")
    bad = 0
    for level in LEVELS:
        objs = glob.glob(os.path.join(build, "**", f"conv_direct_{level}.o"), recursive=True)
        if not objs:
            sys.exit(f"no conv_direct_{level}.o under {build}")
        for name, insns in sorted(functions(objs[0]).items()):
            for a, b, arith, spills in hot_loops(insns):
                bad += spills > 0
                print(f"{level:7} {name:40} loop {a:#7x}-{b:#7x}: {arith:3} vector multiply-adds, "
                      f"{spills} stack accesses{'  <- SPILLS' if spills else ''}")
    print("no spills in the hot loops" if not bad else f"{bad} hot loops touch the stack")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
