# From openai-agents 0.24.0 (https://github.com/openai/openai-agents-python), tests/__init__.py,
# copied unchanged below these three lines by tests/agents_sdk/copy_sdk_tests.py.
# Copyright (c) 2025 OpenAI. MIT License: see LICENSE in this directory.
