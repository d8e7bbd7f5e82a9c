"""The benchmark behind `treeflash bench`: prompt sets, measured runs (in-process or over HTTP),
summaries with spread and checks, and the table / JSON / plot they end up in."""
