"""Build a lab notebook from a percent-format source (the authoring tool; the .ipynb is what ships).

    python scripts/nb_from_py.py SRC.py labs/NN_name/NN_name.ipynb

`# %% [markdown]` starts a markdown cell (its lines lose a leading '# '), `# %%` a code cell,
`# %% parameters` the papermill parameters cell. Outputs are empty; the kernel is python3.
"""
from __future__ import annotations

import sys

import nbformat


def convert(text: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (quant-lab)", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    kind, tags, lines = None, [], []

    def flush():
        if kind is None:
            return
        body = "\n".join(lines).strip("\n")
        if kind == "markdown":
            body = "\n".join(l[2:] if l.startswith("# ") else l.lstrip("#") for l in body.split("\n"))
            nb.cells.append(nbformat.v4.new_markdown_cell(body))
        else:
            cell = nbformat.v4.new_code_cell(body)
            if tags:
                cell.metadata["tags"] = list(tags)
            nb.cells.append(cell)

    for line in text.split("\n"):
        if line.startswith("# %%"):
            flush()
            rest = line[4:].strip()
            kind = "markdown" if rest.startswith("[markdown]") else "code"
            tags = ["parameters"] if rest == "parameters" else []
            lines = []
        else:
            lines.append(line)
    flush()
    return nb


if __name__ == "__main__":
    src, dst = sys.argv[1:3]
    nb = convert(open(src, encoding="utf-8").read())
    nbformat.validate(nb)
    nbformat.write(nb, dst)
    print(f"wrote {dst}: {len(nb.cells)} cells")
