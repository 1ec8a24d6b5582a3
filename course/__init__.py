"""Course mechanics: choose solutions or exercises, generate stubs, grade, build notebooks.

Notebooks and graded tests get a chapter's module with :func:`load`, which returns either the
reference answers in ``solutions/`` or the learner's file in ``exercises/``, by one switch:
the ``TINY_COURSE_MODE`` environment variable (``exercises`` by default) or pytest's
``--course-mode`` option.
"""
from course.hints import hint
from course.loader import ROOT, load, mode

__all__ = ["ROOT", "hint", "load", "mode"]
