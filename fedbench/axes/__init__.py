"""The federation's axes: the ways a round varies for any method, each a module here and each listed once in the
registry (`fedbench.axes.registry.AXES`) that the recipe parser, `fedbench list`, the reference pages and the
build-time checks read. Links' transforms (compression, error feedback), adversaries and the robust rule,
participation and uneven local steps, client dropout, privacy (clipping, noise and its accountant), the server
optimizer, and the participants' slots through which every masking rule of a round acts (`fedbench.axes.slots`).

They sit below the engine (`fedbench.engine`), which applies them, and above the problems and algorithms they act
on; they import nothing of the engine.
"""
