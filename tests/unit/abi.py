#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The exported ABI is the public API, and nothing else.

Three lists must be the same set of names:
  - the functions libmoshpit.so defines in its dynamic symbol table
    (nm -D --defined-only, less the version nodes);
  - the functions the installed headers (include/moshpit/**/*.h) declare
    at file scope, less static inline helpers and typedefs;
  - the global: entries of the version script (src/libmoshpit.map).

A name too many in the library is an internal function that leaked (its
layer lost hidden visibility, or the map got a wildcard); a name too few is
a public function that lost MP_API or was left out of the map.

usage: abi.py NM LIBMOSHPIT_SO INCLUDE_DIR MAP
"""
import os
import re
import subprocess
import sys


def strip_comments(text):
    text = re.sub(r'/\*.*?\*/', ' ', text, flags=re.S)
    return re.sub(r'//[^\n]*', ' ', text)


def drop_cplusplus(text):
    # extern "C" { ... } is only seen by C++; its braces would look like a
    # block around every declaration.
    return re.sub(r'#\s*ifdef\s+__cplusplus.*?#\s*endif', ' ', text, flags=re.S)


def drop_preprocessor(text):
    out = []
    cont = False
    for line in text.split('\n'):
        if cont or line.lstrip().startswith('#'):
            cont = line.rstrip().endswith('\\')
            continue
        out.append(line)
    return '\n'.join(out)


def header_functions(path):
    """Names of the functions a header declares at file scope."""
    with open(path, encoding='utf-8') as f:
        text = drop_preprocessor(drop_cplusplus(strip_comments(f.read())))
    names = set()
    depth = 0
    stmt = []
    # File-scope statements end at ';' or at a '{' (a struct, enum or a
    # function body opens); what is inside braces is never a declaration
    # of its own (struct members, function pointers, inline bodies).
    for ch in text:
        if ch == '{':
            if depth == 0:
                names.update(declared(''.join(stmt)))
                stmt = []
            depth += 1
        elif ch == '}':
            depth -= 1
        elif depth == 0:
            if ch == ';':
                names.update(declared(''.join(stmt)))
                stmt = []
            else:
                stmt.append(ch)
    return names


def declared(stmt):
    words = stmt.split()
    if not words or 'typedef' in words or 'static' in words:
        return []
    # The declared name is the first mp_ identifier followed by '(' outside
    # any parentheses: a parameter that is a function pointer sits inside.
    depth = 0
    for m in re.finditer(r'\(|\)|\bmp_[a-z0-9_]+(?=\s*\()', stmt):
        tok = m.group(0)
        if tok == '(':
            depth += 1
        elif tok == ')':
            depth -= 1
        elif depth == 0:
            return [tok]
    return []


def library_symbols(nm, lib):
    out = subprocess.run([nm, '-D', '--defined-only', lib], check=True,
                         capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        kind, name = parts[1], parts[2]
        if kind == 'A':  # a version node (MOSHPIT_0.1), not a symbol
            continue
        names.add(name.split('@')[0])
    return names


def map_symbols(path):
    with open(path, encoding='utf-8') as f:
        text = re.sub(r'#[^\n]*', ' ', f.read())
    names = set()
    for node in re.finditer(r'([A-Za-z0-9_.]+)\s*\{(.*?)\}', text, flags=re.S):
        body = node.group(2)
        m = re.search(r'global\s*:(.*?)(local\s*:|$)', body, flags=re.S)
        if m:
            names.update(n.strip() for n in m.group(1).split(';') if n.strip())
    if not re.search(r'local\s*:\s*\*\s*;', text):
        print(f'{path}: no "local: *;": symbols not listed would be exported')
        names.add('<local: * missing>')
    return names


def compare(what, got, want, too_many, too_few):
    extra = sorted(got - want)
    missing = sorted(want - got)
    for n in extra:
        print(f'{what}: {n} {too_many}')
    for n in missing:
        print(f'{what}: {n} {too_few}')
    return not extra and not missing


def main():
    if len(sys.argv) != 5:
        print(__doc__)
        return 2
    nm, lib, incdir, mapfile = sys.argv[1:]
    public = set()
    for root, _, files in os.walk(incdir):
        for f in sorted(files):
            if f.endswith('.h'):
                public |= header_functions(os.path.join(root, f))
    exported = library_symbols(nm, lib)
    listed = map_symbols(mapfile)
    ok = compare(os.path.basename(lib), exported, public,
                 'is exported, but no public header declares it (internal: keep it hidden)',
                 'is declared public, but not exported (MP_API? in the map?)')
    ok &= compare(os.path.basename(mapfile), listed, public,
                  'is listed, but no public header declares it',
                  'is declared public, but not listed')
    if not public:
        print(f'no declarations found under {incdir}')
        ok = False
    print(f'{len(exported)} exported, {len(public)} declared, {len(listed)} in the map'
          + ('' if ok else ': MISMATCH'))
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
