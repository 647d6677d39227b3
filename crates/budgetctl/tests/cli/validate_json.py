"""Validates budgetctl's --json documents against docs/schemas (JSON Schema draft 2020-12).

Reads one JSON object on stdin:
  {"schemas": DIR, "documents": [[NAME, DOCUMENT], ...], "check_schemas": [NAME, ...]}
and prints one JSON object on stdout:
  {"documents": [[ERROR, ...], ...], "schemas": {NAME: [ERROR, ...]}}
each ERROR a line naming where (a JSON path) and what. Run by crates/budgetctl/tests/cli/schemas.rs
with the suite's Python (tests/python/requirements.txt pins jsonschema).
"""

import json
import os
import sys

from jsonschema import Draft202012Validator

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def where(error):
    return "$" + "".join(
        f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path
    )


def message(error):
    text = error.message
    return text if len(text) <= 300 else text[:300] + "…"


def load(directory, name, cache):
    if name not in cache:
        path = os.path.join(directory, f"{name}.schema.json")
        with open(path, encoding="utf-8") as f:
            cache[name] = json.load(f)
    return cache[name]


def main():
    request = json.load(sys.stdin)
    directory = request["schemas"]
    cache = {}
    schemas = {}
    for name in request.get("check_schemas", []):
        schema = load(directory, name, cache)
        meta = Draft202012Validator(Draft202012Validator.META_SCHEMA)
        problems = [f"{where(e)}: {e.message}" for e in meta.iter_errors(schema)]
        if schema.get("$schema") != DRAFT:
            problems.append(f"$schema is {schema.get('$schema')!r}, not {DRAFT!r}")
        schemas[name] = problems
    documents = []
    for name, document in request.get("documents", []):
        try:
            schema = load(directory, name, cache)
        except OSError as e:
            documents.append([f"no schema for `{name}`: {e}"])
            continue
        validator = Draft202012Validator(schema)
        errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
        lines = []
        for e in errors:
            lines.append(f"{where(e)}: {message(e)}")
            # A oneOf failure says little by itself: name what each branch refused.
            for sub in e.context or []:
                lines.append(f"  {where(sub)}: {message(sub)}")
        documents.append(lines)
    json.dump({"documents": documents, "schemas": schemas}, sys.stdout)


main()
