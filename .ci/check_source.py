#!/usr/bin/env python3
"""check_source.py -- three rules of the product tree, checked from the
source (universal-ctags reads the definitions, no build needed):

  names     no name is defined in more than one product file: functions,
            variables, macros, types, enumerators and namespaces at file
            scope, statics and anonymous namespaces included, compared
            without the module prefix (a static `bounded_len` clashes with
            `fp4idx__bounded_len`)
  long      no product function is longer than --max-lines (150) lines,
            from the line of its name to its closing brace
  includes  no #include "..." points up a layer: protocol -> kernels ->
            persist -> client -> daemon -> bench (a file may include its own
            layer and those before it), and nothing outside a program's
            folder (client/cli/) includes its headers

The product is every tracked .c, .h, .cu and .cuh file under protocol/,
kernels/, persist/, client/ and daemon/ (and bench/ for `includes`, the top
layer); the headers the build generates (protocol/gen_optable.py) are
placed by name. .ci/check_source.allow lists the exceptions, one a line:
`RULE KEY  reason` (KEY: a name for `names`, FILE:FUNCTION for `long`,
FILE:HEADER for `includes`); an entry that matches nothing any more is
reported so that it can go.

  .ci/check_source.py [--report] [--root DIR] [names|long|includes ...]

Prints every finding; exits 1 when a finding is not in the allow file
(--report: lists everything, allowed or not, and exits 0).
"""
import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys

LAYERS = ["protocol", "kernels", "persist", "client", "daemon", "bench"]
# A program's folder inside a layer: the files outside it do not include it
# (the daemon does not reach into the CLI).
PROGRAMS = ["client/cli/"]
PRODUCT = LAYERS[:-1]
SOURCE_EXT = (".c", ".h", ".cu", ".cuh")
# Headers written into the build tree by protocol/gen_optable.py, by layer.
GENERATED = {"fp4idx_op_map.h": "protocol", "fp4idx_op_types.h": "protocol",
             "codec_gen.h": "protocol", "fp4idx_client_ops.h": "client"}
# CUDA qualifiers hidden from ctags' C++ parser, which would otherwise take
# `__launch_bounds__(N)` for the function's name.
CUDA_DEFINES = ["__launch_bounds__(...)=", "__cluster_dims__(...)=", "__global__=",
                "__device__=", "__host__=", "__forceinline__=", "__noinline__=",
                "__grid_constant__=", "__shared__=", "__constant__=", "__restrict__="]
PREFIX = re.compile(r"^fp4idx[d]?_+", re.IGNORECASE)
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def tracked(root, dirs):
    out = subprocess.run(["git", "-C", root, "ls-files", "--"] + dirs,
                         check=True, capture_output=True, text=True).stdout
    return [f for f in out.split() if f.endswith(SOURCE_EXT)]


def tags(root, files):
    """ctags' definitions of `files`, as dicts (name, path, kind, line, end,
    scope, scopeKind)."""
    ctags = shutil.which("ctags-universal") or shutil.which("ctags")
    if not ctags:
        sys.exit("check_source.py: needs universal-ctags (Debian: universal-ctags)")
    cmd = [ctags, "--output-format=json", "--fields=+neKZ", "-f", "-",
           "--languages=C,C++", "--langmap=C:.c.h", "--langmap=C++:+.cu.cuh",
           "--kinds-C=fvdstgue", "--kinds-C++=fvdstgucne"]
    for d in CUDA_DEFINES:
        cmd += ["-D", d]
    out = subprocess.run(cmd + files, cwd=root, check=True, capture_output=True,
                         text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def file_scope(t):
    """At file scope: no enclosing scope, or only namespaces (named or
    anonymous) or an enum (C's enumerators are file-scope names), not a
    function, struct or class."""
    return t.get("scopeKind") in (None, "namespace", "enum")


def check_names(root, alltags):
    by_name = collections.defaultdict(set)
    spelled = collections.defaultdict(set)
    for t in alltags:
        if not file_scope(t) or t["kind"] == "namespace" and t["name"].startswith("__anon"):
            continue
        key = PREFIX.sub("", t["name"])
        by_name[key].add(t["path"])
        spelled[key].add(t["name"])
    return {k: "%s: %s" % ("/".join(sorted(spelled[k])), " ".join(sorted(v)))
            for k, v in by_name.items() if len(v) > 1}


def check_long(root, alltags, max_lines):
    found = {}
    for t in alltags:
        if t["kind"] != "function" or "end" not in t:
            continue
        n = t["end"] - t["line"] + 1
        if n > max_lines:
            found["%s:%s" % (t["path"], t["name"])] = "%s:%d: %s, %d lines" % (
                t["path"], t["line"], t["name"], n)
    return found


def check_includes(root, files):
    names = collections.defaultdict(list)
    for f in files:
        names[os.path.basename(f)].append(f)
    found = {}
    for f in files:
        layer = LAYERS.index(f.split("/")[0])
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            for no, line in enumerate(fh, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                here = os.path.normpath(os.path.join(os.path.dirname(f), inc))
                if here in files:
                    target = here
                elif os.path.basename(inc) in GENERATED:
                    target = GENERATED[os.path.basename(inc)] + "/(generated)/" + inc
                elif len(names[os.path.basename(inc)]) == 1:
                    target = names[os.path.basename(inc)][0]
                else:
                    found["%s:%s" % (f, inc)] = "%s:%d: \"%s\" names %s" % (
                        f, no, inc, " or ".join(names[os.path.basename(inc)]) or "no tracked file")
                    continue
                if LAYERS.index(target.split("/")[0]) > layer:
                    found["%s:%s" % (f, inc)] = "%s:%d: includes %s (%s above %s)" % (
                        f, no, target, target.split("/")[0], LAYERS[layer])
                for prog in PROGRAMS:
                    if target.startswith(prog) and not f.startswith(prog):
                        found["%s:%s" % (f, inc)] = "%s:%d: includes %s (the program %s)" % (
                            f, no, target, prog.rstrip("/"))
    return found


def load_allow(path):
    allow = collections.defaultdict(dict)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            for no, line in enumerate(fh, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                parts = line.split(None, 2)
                if len(parts) < 3:
                    sys.exit("%s:%d: want `RULE KEY reason`" % (path, no))
                allow[parts[0]][parts[1]] = parts[2]
    return allow


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rules", nargs="*", metavar="names|long|includes")
    ap.add_argument("--report", action="store_true", help="list all, exit 0")
    ap.add_argument("--max-lines", type=int, default=150)
    ap.add_argument("--root", help="the checkout to check (default: the one holding this script)")
    ap.add_argument("--allow", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                    "check_source.allow"))
    args = ap.parse_args()
    args.rules = args.rules or ["names", "long", "includes"]
    for r in args.rules:
        if r not in ("names", "long", "includes"):
            ap.error("unknown rule %s" % r)
    root = subprocess.run(["git", "-C", args.root or os.path.dirname(os.path.abspath(__file__)), "rev-parse",
                           "--show-toplevel"], check=True, capture_output=True,
                          text=True).stdout.strip()
    product = tracked(root, PRODUCT)
    alltags = tags(root, product) if {"names", "long"} & set(args.rules) else []
    allow = load_allow(args.allow)
    failed = 0
    for rule in args.rules:
        if rule == "names":
            found = check_names(root, alltags)
        elif rule == "long":
            found = check_long(root, alltags, args.max_lines)
        else:
            found = check_includes(root, tracked(root, LAYERS))
        if rule == "names":  # the allow file may spell a name with its prefix
            allow[rule] = {PREFIX.sub("", k): v for k, v in allow[rule].items()}
        bad = [k for k in found if k not in allow[rule]]
        print("== %s: %d found, %d not allowed" % (rule, len(found), len(bad)))
        for k in sorted(found):
            mark = "  allowed: " + allow[rule][k] if k in allow[rule] else ""
            if args.report or not mark:
                print("  %s%s" % (found[k], mark))
        for k in sorted(set(allow[rule]) - set(found)):
            print("  stale allow entry (matches nothing now): %s %s" % (rule, k))
        failed += len(bad)
    return 0 if args.report or not failed else 1


if __name__ == "__main__":
    sys.exit(main())
