"""rpegc passes: one ModulePass per file; `rpegc.registry` lists them."""
