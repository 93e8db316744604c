"""Runs one submission inside the grading sandbox (ci.sandbox starts it; the grader never imports it).

    python grade_driver.py WORK

WORK/run.ipynb holds the cells to run, each with metadata quantlab.role: the lab's exercise setup cell,
the student's helper and solution cells, the course's visible check cells. WORK/plan.json says the cell
limit and {exercise: function name}. Every cell runs under the limit in one kernel; a cell that kills
the kernel or is cut gets that written as its output, and a fresh kernel re-runs the definitions that
worked (setup, helpers, solutions) and goes on with the next cell. Then, only once the student's cells
are done, this driver asks for the cases on stdout with the nonce the grader gave it first on stdin (no
student process can read it: this process is made undumpable before any kernel starts), the grader takes
its copy of the notebook so far and sends the cases' inputs (the hidden ones included), and each
exercise's function runs on them in a cell of its own, writing WORK/out/answers/<exercise>.json. Nothing
here decides a point: the grader compares the answers outside. WORK/out/executed.ipynb and
WORK/out/events.json are rewritten after every cell, so a submission cut as a whole keeps what it did;
a cell's outputs past MAX_CELL characters are dropped as they arrive.
"""
from __future__ import annotations

import copy
import ctypes
import json
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

DEFINES = ("setup", "helper", "solution")
SETUP_LIMIT = 120          # seconds for the course's own setup cell (imports): a busy machine is not the student's fault
MAX_TEXT = 20_000          # characters of one output kept in the hand-back
MAX_RESTARTS = 12
MAX_CELL = 1_000_000       # characters of outputs one cell may add: a loop that displays for 30 s fills nothing
OUTPUTS = ("stream", "display_data", "execute_result", "error")
REQUEST = "quantlab: the cases, please"      # ci.sandbox.REQUEST


class Client(NotebookClient):
    """nbclient, dropping a cell's outputs past MAX_CELL characters as they arrive (one note says so)."""

    def process_message(self, msg, cell, cell_index):
        if msg.get("msg_type") in OUTPUTS:
            sizes = self.__dict__.setdefault("_quantlab_sizes", {})
            before = sizes.get(cell_index, 0)
            sizes[cell_index] = before + len(json.dumps(msg.get("content"), default=str))
            if sizes[cell_index] > MAX_CELL:
                if before <= MAX_CELL:
                    cell.outputs.append(nbformat.v4.new_output(
                        "stream", name="stdout", text=f"\n... (outputs past {MAX_CELL:,} characters left out by the grader)\n"))
                return None
        return super().process_message(msg, cell, cell_index)


def undumpable() -> None:
    """No process of the same user may read this one's memory or descriptors (/proc/PID/mem, fd/0): the nonce
    and the cases stay here. Kernels started from here are exec'd, so dumpable again, as they should be."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)      # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        pass


def role(cell) -> str:
    return cell.metadata.get("quantlab", {}).get("role", "")


def write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def trim(cell) -> None:
    """Keep a cell's outputs to a readable size: a loop that prints for 30 s must not fill the disk."""
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream" and len(o.get("text", "")) > MAX_TEXT:
            o["text"] = o["text"][:MAX_TEXT] + "\n... (output cut by the grader)\n"
        for key, val in list(o.get("data", {}).items()):
            if isinstance(val, str) and len(val) > 10 * MAX_TEXT:
                o["data"][key] = "(output too large: left out by the grader)"


def failed_output(kind: str, limit: int) -> dict:
    text = (f"cut at the {limit} s cell limit" if kind == "cut"
            else "the kernel died while this cell ran (a crash such as os._exit); the grader started a new one")
    return nbformat.v4.new_output("error", ename="KernelDied" if kind == "died" else "CellTimeout", evalue=text,
                                  traceback=[text])


def main(work: Path) -> int:
    nonce = sys.stdin.readline().strip()
    undumpable()
    plan = json.loads((work / "plan.json").read_text())
    limit = int(plan["cell_timeout"])
    nb = nbformat.read(work / "run.ipynb", as_version=4)
    out = work / "out"
    (out / "answers").mkdir(parents=True, exist_ok=True)
    inbox = work / "inputs"
    inbox.mkdir(exist_ok=True)
    events: dict[str, str] = {}            # cell index -> "died" | "cut"
    pending: list = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    pending += [("harvest", ex) for ex in plan["exercises"]]
    defined: list[int] = []
    inputs = None
    restarts = 0

    def save():
        nbformat.write(nb, out / "executed.ipynb.tmp")
        os.replace(out / "executed.ipynb.tmp", out / "executed.ipynb")
        write_json(out / "events.json", {"events": events, "restarts": restarts})

    while pending and restarts <= MAX_RESTARTS:
        client = Client(nb, timeout=limit, allow_errors=True, kernel_name="python3", startup_timeout=60,
                                shutdown_kernel="immediate", resources={"metadata": {"path": str(work)}},
                                timeout_func=lambda cell: max(limit, SETUP_LIMIT) if role(cell) == "setup" else limit)
        try:
            with client.setup_kernel():
                for i in list(defined):                      # a new kernel: the definitions that worked
                    try:
                        client.execute_cell(copy.deepcopy(nb.cells[i]), i)
                    except (DeadKernelError, CellTimeoutError):
                        defined.remove(i)
                        events[str(i)] = "died"
                        raise
                while pending:
                    step = pending[0]
                    if isinstance(step, tuple):              # the student's cells are done: now the cases
                        ex = step[1]
                        if inputs is None:
                            save()
                            os.write(1, f"\n{REQUEST} {nonce}\n".encode())
                            inputs = json.loads(sys.stdin.read() or "{}")
                        (inbox / f"{ex}.json").write_text(json.dumps(inputs.get(ex, [])))
                        src = (f"__import__('utils.exercises', fromlist=['harvest']).harvest({plan['exercises'][ex]!r}, "
                               f"globals(), {str(inbox / (ex + '.json'))!r}, {str(out / 'answers' / (ex + '.json'))!r})")
                        nb.cells.append(nbformat.v4.new_code_cell(src, metadata={"quantlab": {"role": "harvest",
                                                                                              "exercise": ex}}))
                        pending[0] = len(nb.cells) - 1
                    i = pending[0]
                    try:
                        client.execute_cell(nb.cells[i], i)
                    except (DeadKernelError, CellTimeoutError) as e:
                        kind = "cut" if isinstance(e, CellTimeoutError) else "died"
                        events[str(i)] = kind
                        nb.cells[i].outputs.append(failed_output(kind, limit))
                        pending.pop(0)
                        raise
                    finally:
                        trim(nb.cells[i])
                        save()
                    pending.pop(0)
                    if role(nb.cells[i]) in DEFINES:
                        defined.append(i)
                    if role(nb.cells[i]) == "harvest":
                        (inbox / f"{nb.cells[i].metadata['quantlab']['exercise']}.json").unlink(missing_ok=True)
        except (DeadKernelError, CellTimeoutError):
            restarts += 1
            save()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
