"""Task files: the labelled data fine-tuning reads (``finetuning.records`` re-exports ``records``) and the
evaluation sets the build decontaminates against (``pipeline.curate.eval_sets``). One reader for both, in
``pipeline`` because the build may not import ``finetuning`` (tests/test_layering.py)."""
