"""The course's own code for each chapter: what plugs an exercise into the real pipeline, runs it,
draws or measures the result. Not exercises, so it lives here and not in ``exercises/``.

One module per chapter that has such code, named like the chapter's exercise file
(``course/chapters/ch07_loop_ir.py`` serves ``exercises/ch07_loop_ir.py``). A helper that runs the
learner's code takes it as an argument -- ``use_fusion_check(ch.fusion_is_legal)``, where ``ch`` is
the chapter module the notebook or graded test loaded (the learner's file or the reference
answers) -- so nothing here imports ``solutions/`` or ``exercises/``, and a stub can never pass a
graded test through a helper.
"""
