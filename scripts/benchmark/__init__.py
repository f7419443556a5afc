"""Side-by-side performance of gptlab on this machine, printed as a table and written as JSON.

Run from the repository root:

    python -m scripts.benchmark                 # the full run (about 25 min on 2 quiet CPU cores,
                                                #   + row 8: 16 min on 2 loaded ones)
    python -m scripts.benchmark --repeats 3     # ... each throughput side 3 times
    python -m scripts.benchmark --quick         # every row, few steps: a smoke run (about 2 min)
    python -m scripts.benchmark --device cuda   # on a GPU
    python -m scripts.benchmark --downstream --repeats 3   # row 10 alone (the tasks' data in
                                                #   GPTLAB_DATA_DIR, else --tasks-data)

gptlab is measured as a user runs it: every measured side is a process of its own (real
`gptlab-train` processes with overrides, the reference script's loop, a bare PyTorch loop), read
through what it writes anyway (metrics.json, TensorBoard event files, its JSON) and its
/proc/<pid>/status. Nothing in gptlab is imported by this process, nothing is patched.

The rows (training steps/s always over training steps only; validation is timed apart):

1. speed-up at the reference setting: scripts/reference_loop.py (the seed article's script) against
   `gptlab-train experiment=reference`, the same steps;
2. precision: experiment=reference and the default run again with bf16-mixed: steps/s and the
   final val loss after the same steps, fp32 against bf16;
3. Lightning's overhead: gptlab's GPT, AdamW and batches in a bare PyTorch loop
   (bare_loop.py, the model a gptlab-train run trained) against that run's steps/s;
4. start-up: spawn of `gptlab-train debug=fast` to its first train/loss TensorBoard record;
5. the default run: its peak resident memory, and the time it takes to reach the final val loss
   of experiment=reference against the reference run's wall time;
6. a busy machine: the default run as shipped, quiet, then beside one CPU-bound process;
7. a corpus of 100 and 400 MB of text (the book repeated): tokenization (a cold start minus a
   warm one) against bare tiktoken batch-encoding the same text on every core, each run's peak
   memory, the token store's bytes per byte of text, training tokens/s on that store.
8. generation: GPT.generate's tokens/s with the KV cache and without (bare_generate.py), on the
   default model and on d_model 512 x 8 blocks, batch 1 and 8;
9. a data mixture's cost: the book as one source against its two halves as a mixture of two
   sources, steps/s end to end, and the batches alone (bare_batches.py); not in --quick.
10. (--downstream, alone) callbacks=downstream's cost: the default run with it and without,
   alternating; its scoring seconds over the run's training seconds, and the wall times' ratio.

Module by module: cli (options, the order of the stages, the JSON), stages (each row's runs),
runs (a gptlab-train process and what it wrote), processes (a child, its peak memory, the
competitor), reference (the reference loop's process), bare_loop (the overhead row's bare side,
a script of its own), corpus and bare_tokenize (row 7; the latter a script of its own), machine
(the CPU and its bf16 flags), table (targets, verdicts, the table), generation and bare_generate
(row 8; the latter a script of its own), mixing and bare_batches (row 9; the latter a script of
its own), downstream (row 10).
"""
