"""`pocket import`: ONNX models trained elsewhere -> the pocket IR and a `.bin` (DESIGN §6).

    reader.py    ONNX -> IR: constants, shape arithmetic, names, shapes, the error list
    ops_core.py  one importer per IR op, in the registry's `onnx_import` slot
    passes.py    IR rewrites after the walk: Add-into-bias, QDQ pairs -> int8 layers
    app.py       the command: import, optionally quantize, write atomically; in-memory loads

Like export, this package reads `onnx` lazily (the edge install has none) and never imports the
trainer or the engine.
"""
