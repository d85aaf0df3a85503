"""The vocabulary learner is reproducible: the same word counts give the same vocab.txt, byte for
byte, in separate processes with different hash seeds and input orders, even when many merge
counts tie (the Hugging Face trainer alone varied both the order and the set of pieces)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
VOCAB_SIZE = 1000

# Learns a vocab from ~3,000 synthetic words whose counts are 2, 3 or 4 (so most merge counts
# tie), given in the order shuffled by argv[1]; writes the tokens, one a line, to stdout.
DRIVER = """
import random, sys
from beam_jobs.vocab import learn_wordpiece
rng = random.Random(0)
letters = "abcdefghijklmnopqrstuvwxyzéßж"
words = set()
while len(words) < 3000:
    words.add("".join(rng.choice(letters) for _ in range(rng.randint(2, 9))))
counts = [(w, rng.choice((2, 3, 4))) for w in sorted(words)]
random.Random(int(sys.argv[1])).shuffle(counts)
tokens = learn_wordpiece(counts, vocab_size=%d)
sys.stdout.buffer.write(("\\n".join(tokens) + "\\n").encode("utf-8"))
""" % VOCAB_SIZE


def learn_in_processes(seeds) -> list[bytes]:
    """Runs DRIVER once per seed, at the same time: PYTHONHASHSEED=seed, input shuffled by seed."""
    processes = [
        subprocess.Popen([sys.executable, "-c", DRIVER, str(seed)], cwd=PROJECT,
                         env=dict(os.environ, PYTHONHASHSEED=str(seed), PYTHONPATH=str(PROJECT)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for seed in seeds]
    outputs = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err.decode("utf-8", "replace")[-3000:]
        outputs.append(out)
    return outputs


def test_vocab_is_byte_identical_across_processes_and_input_orders():
    first, *others = learn_in_processes([1, 2, 3])
    for other in others:
        a, b = first.decode("utf-8").split("\n"), other.decode("utf-8").split("\n")
        differ = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        assert other == first, (
            f"{len(differ)} lines differ (first at line {differ[:1]}); "
            f"{len(set(a) ^ set(b))} tokens are in only one of the two vocabs")

    tokens = first.decode("utf-8").split("\n")[:-1]
    assert len(tokens) == VOCAB_SIZE == len(set(tokens))
    # Google's layout.
    assert tokens[0] == "[PAD]"
    assert tokens[1:100] == [f"[unused{i}]" for i in range(99)]
    assert tokens[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    # Then the single characters, the ## single characters, each sorted; then longer pieces.
    learned = tokens[104:]
    chars = [t for t in learned if len(t) == 1]
    continuations = [t for t in learned if len(t) == 3 and t.startswith("##")]
    assert learned[:len(chars)] == sorted(chars) == sorted("abcdefghijklmnopqrstuvwxyzéßж")
    assert learned[len(chars):len(chars) + len(continuations)] == sorted(continuations)
    assert len(continuations) == len(chars)
    assert all(len(t.removeprefix("##")) > 1 for t in learned[len(chars) + len(continuations):])


def test_vocab_job_gives_the_same_file_in_other_folders_and_processes(tmp_path):
    """`python -m beam_jobs.vocab` on the same text in two folders, in two processes with
    different hash seeds (and a multi-process runner in one): byte-identical vocab.txt."""
    import random

    rng = random.Random(5)
    letters = "abcdefghijklmnopqrstuvwxyzéßжΣ中"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(1, 8))) for _ in range(600)]
    text = "\n".join(" ".join(rng.choice(words) for _ in range(12)) + " ." for _ in range(1500))
    runs = []
    for i, extra in enumerate([[], ["--direct_running_mode=multi_processing",
                                    "--direct_num_workers=2"]]):
        folder = tmp_path / f"run{i}" / "corpus"
        folder.mkdir(parents=True)
        (folder / "part-00000.txt").write_text(text, encoding="utf-8")
        out = tmp_path / f"run{i}" / "vocab" / "vocab.txt"
        runs.append((subprocess.Popen(
            [sys.executable, "-m", "beam_jobs.vocab", "--input", str(folder / "*.txt"),
             "--output", str(out), "--vocab_size", "300", "--runner=FnApiRunner", *extra],
            cwd=PROJECT, env=dict(os.environ, PYTHONHASHSEED=str(i + 7), PYTHONPATH=str(PROJECT)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE), out))
    for process, _ in runs:
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err.decode("utf-8", "replace")[-3000:]
    first, second = (out.read_bytes() for _, out in runs)
    assert first == second
    assert len(first.decode("utf-8").split("\n")) > 200
