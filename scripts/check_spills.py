#!/usr/bin/env python3
"""Compiles the direct-convolution kernels once per instruction-set level, as setup.py does, and reports
the stack traffic inside their innermost multiply-add loops: a packed vector load, store or operand at
(%rsp) or (%rbp) there is an accumulator or operand the register file could not hold (a spill). Prints a
line per level and loop; exits 1 if any hot loop touches the stack.

    python scripts/check_spills.py            # tests/unit/test_simd.py runs it

The kernels' tiles are sized to each level's registers (csrc/engine/conv_direct_kernels.h: TILE_ACC,
DW_OB, DW_CV, DW_KR); this is the check that they still fit after a change or with another compiler.
The AVX-512 build is read here on any x86-64 CPU, whether or not it can run it.
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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


# setup.py's flags for the extension's sources (extension()), less those that do not change the code
FLAGS = ["-O3", "-std=c11", "-fvisibility=hidden", "-fPIC", "-D_GNU_SOURCE", "-Icsrc"]


def compile_level(level, out_dir):
    obj = os.path.join(out_dir, f"conv_direct_{level}.o")
    # CC as make and setuptools read it: a command with its own words ("ccache gcc")
    compiler = shlex.split(os.environ.get("CC", "gcc"))
    subprocess.run([*compiler, *FLAGS, "-c", f"csrc/engine/conv_direct_{level}.c", "-o", obj], check=True, cwd=ROOT)
    return obj


def main():
    bad = 0
    with tempfile.TemporaryDirectory() as out_dir:
        for level in LEVELS:
            for name, insns in sorted(functions(compile_level(level, out_dir)).items()):
                for a, b, arith, spills in hot_loops(insns):
                    bad += spills > 0
                    print(f"{level:7} {name:40} loop {a:#7x}-{b:#7x}: {arith:3} vector multiply-adds, "
                          f"{spills} stack accesses{'  <- SPILLS' if spills else ''}")
    print("no spills in the hot loops" if not bad else f"{bad} hot loops touch the stack")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
