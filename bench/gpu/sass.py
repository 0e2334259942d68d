#!/usr/bin/env python3
"""Machine code of chosen kernels, on the device machine (it has cuobjdump; this one has not).

    python3 bench/gpu/sass.py OBJECT REGEX [REGEX ...] [--out DIR]

For every function of OBJECT (an object file or executable) whose mangled name matches a
REGEX: its instruction count, a histogram of opcodes, and (with --out) its SASS in
DIR/<n>.sass. A count of instructions a weight is what an issue-bound kernel's time follows.
"""
import collections
import re
import subprocess
import sys


def main():
    args = sys.argv[1:]
    out = None
    if "--out" in args:
        i = args.index("--out")
        out = args[i + 1]
        del args[i : i + 2]
    if len(args) < 2:
        sys.exit(__doc__)
    obj, pats = args[0], [re.compile(p) for p in args[1:]]
    text = subprocess.run(["cuobjdump", "-sass", obj], capture_output=True, text=True, check=True).stdout
    funcs = re.split(r"\n\s*Function : ", text)
    n = 0
    for f in funcs[1:]:
        name = f.split("\n", 1)[0].strip()
        if not any(p.search(name) for p in pats):
            continue
        ops = collections.Counter()
        for line in f.split("\n"):
            m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
            if m:
                ops[m.group(2).split(".")[0]] += 1
        print(f"{name}: {sum(ops.values())} instructions")
        print("   " + ", ".join(f"{k} {v}" for k, v in ops.most_common(30)))
        if out:
            with open(f"{out}/{n}.sass", "w") as fh:
                fh.write(name + "\n" + f)
        n += 1


if __name__ == "__main__":
    main()
