"""Function lengths in Tally's C++ sources: no function over MAX_LINES lines
and at most MAX_LONG over LONG_LINES, outside tests and the benchmarks'
main(): a function that is three functions is split where its phases are
(docs/decisions.md, "Function length").

    python3 tests/lint/function_length.py [ROOT] [--list]
        [--allow_over_max=N] [--allow_long=N]

The limits are the project's, which CI holds; --allow_* raise them for
a look at a tree that does not meet it yet.

A function's length runs from the line of its name to its closing brace; a
lambda or local class inside a function counts as part of it. The parser is
small and knows this code base's shapes: comments, strings and raw strings
are blanked first, then braces are matched, and a brace at namespace or
class scope opens a function when its header has a parameter list.
Exits 1 with the offenders listed, 0 otherwise.
"""
import os
import re
import sys

MAX_LINES = 80
LONG_LINES = 60
MAX_LONG = 10
FOLDERS = ["common", "proto", "worker", "server", "client", "python", "bench"]
SUFFIXES = (".cc", ".h", ".cu")


def blank(text):
    """Comments and literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and not (
                i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = ")" + m.group(1) + '"'
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # 1'000
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


SCOPE = re.compile(r"\b(namespace|class|struct|union|enum)\b")
CONTROL = re.compile(r"^\s*(if|for|while|switch|catch|do|else|return)\b")


def functions(path):
    """(name, first line, last line) of every function body in the file."""
    text = blank(open(path, encoding="utf-8", errors="replace").read())
    text = re.sub(r"^\s*#.*$", lambda m: " " * len(m.group(0)), text,
                  flags=re.M)  # preprocessor lines
    found = []
    stack = []  # (kind, name, start line)
    header_start = 0
    line = 1
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        if c in ";{}":
            inside = any(k == "function" for k, _, _ in stack)
            if c == "{":
                header = text[header_start:i]
                if inside:
                    kind = "block"
                elif SCOPE.search(header) and "(" not in header.split("{")[0]:
                    kind = "scope"
                elif ")" in header and not CONTROL.match(header) and \
                        "=" not in header.rsplit(")", 1)[1]:
                    kind = "function"
                else:
                    kind = "block"
                name = ""
                start = line
                if kind == "function":
                    m = re.search(r"([~\w:<>]+)\s*\(", header)
                    name = m.group(1) if m else "?"
                    lead = len(header) - len(header.lstrip())
                    start = line - header.count("\n") + \
                        header[:lead].count("\n")
                stack.append((kind, name, start))
            elif c == "}" and stack:
                kind, name, start = stack.pop()
                if kind == "function":
                    found.append((name, start, line))
            header_start = i + 1
    return found


def flag(name, default):
    for a in sys.argv[1:]:
        if a.startswith(f"--{name}="):
            return int(a.split("=", 1)[1])
    return default


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    allow_over_max = flag("allow_over_max", 0)
    allow_long = flag("allow_long", MAX_LONG)
    root = args[0] if args else os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rows = []
    for folder in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for f in sorted(files):
                if not f.endswith(SUFFIXES):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                for name, a, b in functions(path):
                    if folder == "bench" and name == "main":
                        continue
                    rows.append((b - a + 1, rel, a, name))
    rows.sort(reverse=True)
    too_long = [r for r in rows if r[0] > MAX_LINES]
    long = [r for r in rows if r[0] > LONG_LINES]
    if "--list" in sys.argv:
        for n, rel, a, name in long:
            print(f"{n:4d}  {rel}:{a}  {name}")
    ok = len(too_long) <= allow_over_max and len(long) <= allow_long
    print(f"function_length: {len(rows)} functions; {len(too_long)} over "
          f"{MAX_LINES} lines (allowed {allow_over_max}; the rule: 0), "
          f"{len(long)} over {LONG_LINES} (allowed {allow_long}; the rule: "
          f"{MAX_LONG})")
    if not ok:
        for n, rel, a, name in long:
            print(f"  {n:4d} lines  {rel}:{a}  {name}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
