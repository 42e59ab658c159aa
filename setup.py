"""The one thing pyproject.toml can't yet say without a warning: the compiled twins (C), each
optional, so that an install without a C compiler goes on with the pure-Python twins
(runwire/core/native.py; docs/observability.md § The compiled OTLP writer)."""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("runwire.jobs._otlp", ["pipeline/jobs/_otlp.c", "pipeline/jobs/_fold.c"],
              depends=["pipeline/jobs/_wire.h"], optional=True, extra_compile_args=["-O2"]),
    Extension("runwire.core._native", ["pipeline/core/_native.c"], optional=True,
              extra_compile_args=["-O2"]),
])
