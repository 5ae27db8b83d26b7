#!/usr/bin/env python3
"""Dev-only: cross-check the hand-written rows of jinja_test.cpp against Python jinja2 configured
as transformers configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, json.dumps-based tojson, raise_exception). The C++ tests never run this."""
import json, re, sys
import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

def raise_exception(m):
    raise jinja2.exceptions.TemplateError(m)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=['jinja2.ext.loopcontrols'])
env.filters['tojson'] = tojson
env.globals['raise_exception'] = raise_exception

def cstr(tok):
    if tok.startswith('R"J('):
        return tok[4:-3]
    return json.loads(tok)  # plain C string literal: escapes compatible with JSON for our rows

src = open(sys.argv[1] if len(sys.argv) > 1 else __file__.replace('crosscheck_jinja.py', 'jinja_test.cpp')).read()
table = src[src.index('const Case kCases[] = {'):src.index('// clang-format on')]
lit = r'(R"J\(.*?\)J"|"(?:[^"\\]|\\.)*")'
rows = re.findall(r'\{\s*' + lit + r',\s*' + lit + r',\s*' + lit + r'\s*\}', table, re.S)
bad = 0
for i, (a, b, c) in enumerate(rows):
    t, ctx, want = cstr(a), json.loads(cstr(b)), cstr(c)
    try:
        got = env.from_string(t).render(**ctx)
    except Exception as e:
        got = 'EXC ' + repr(e)
    if got != want:
        bad += 1
        print(f'row {i}: {t!r}\n  jinja2: {got!r}\n  test:   {want!r}')
print(f'{len(rows)} rows, {bad} differ')
