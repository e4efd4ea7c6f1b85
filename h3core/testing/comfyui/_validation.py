"""Prompt validation as ComfyUI 0.3.64 does it (execution.validate_prompt and validate_inputs).

The same checks in the same order, and the same error dicts, so that a client meets exactly the
400s of a real server; the node specs are the registry's, with the file and model lists of now.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from ._failures import VALIDATION_FRAMES, full_type_name
from ._registry import FILE_INPUTS, MODEL_INPUTS, NODE_INFO, is_output_node

# (valid, error, output node ids to run, node_errors): what validate_prompt returns
Verdict = tuple[bool, Any, list[str], dict[str, Any]]


@dataclass(frozen=True)
class PromptValidator:
    """Validates against the server as it is now (its files, model lists and missing nodes)."""

    info: Callable[[str], dict[str, Any]]  # a class's /object_info entry, file and model lists filled in
    missing_nodes: Collection[str]
    any_model_name: bool  # no `model_files` set: a model combo takes any value
    file_exists: Callable[[Any], bool]  # an (annotated) input file name

    def validate(self, prompt: Any, partial: list[str] | None) -> Verdict:
        outputs: list[str] = []
        for x in prompt:
            if "class_type" not in prompt[x]:
                error = {
                    "type": "invalid_prompt",
                    "message": "Cannot execute because a node is missing the class_type property.",
                    "details": f"Node ID '#{x}'",
                    "extra_info": {},
                }
                return (False, error, [], {})
            class_type = prompt[x]["class_type"]
            if class_type not in NODE_INFO or class_type in self.missing_nodes:
                error = {
                    "type": "invalid_prompt",
                    "message": f"Cannot execute because node {class_type} does not exist.",
                    "details": f"Node ID '#{x}'",
                    "extra_info": {},
                }
                return (False, error, [], {})
            if is_output_node(class_type) and (partial is None or x in partial):
                outputs.append(x)
        if not outputs:
            error = {"type": "prompt_no_outputs", "message": "Prompt has no outputs", "details": "", "extra_info": {}}
            return (False, error, [], {})

        good: list[str] = []
        errors: list[tuple[str, list[dict[str, Any]]]] = []
        node_errors: dict[str, Any] = {}
        validated: dict[str, tuple[bool, list[dict[str, Any]], str]] = {}
        for o in outputs:
            try:
                valid, reasons, _ = self._inputs(prompt, o, validated)
            except Exception as ex:
                valid = False
                reasons = [
                    {
                        "type": "exception_during_validation",
                        "message": "Exception when validating node",
                        "details": str(ex),
                        "extra_info": {"exception_type": full_type_name(ex), "traceback": list(VALIDATION_FRAMES)},
                    }
                ]
                validated[o] = (False, reasons, o)
            if valid is True:
                good.append(o)
                continue
            errors.append((o, reasons))
            for node_id, result in validated.items():
                # Every failed node seen so far is charged with this output, as ComfyUI does.
                if result[0] is not True and len(result[1]) > 0:
                    if node_id not in node_errors:
                        node_errors[node_id] = {
                            "errors": result[1],
                            "dependent_outputs": [],
                            "class_type": prompt[node_id]["class_type"],
                        }
                    node_errors[node_id]["dependent_outputs"].append(o)
        if not good:
            details = "\n".join(f"{e['message']}: {e['details']}" for _, errs in errors for e in errs)
            error = {
                "type": "prompt_outputs_failed_validation",
                "message": "Prompt outputs failed validation",
                "details": details,
                "extra_info": {},
            }
            return (False, error, [], node_errors)
        return (True, None, good, node_errors)

    def _inputs(self, prompt: dict[str, Any], uid: str, validated: dict[str, Any]) -> tuple[bool, list[Any], str]:
        if uid in validated:
            return validated[uid]
        inputs = prompt[uid]["inputs"]
        class_type = prompt[uid]["class_type"]
        class_inputs = self.info(class_type)["input"]
        specs: dict[str, tuple[Any, dict[str, Any], str]] = {}
        for category in ("required", "optional"):
            for name, spec in class_inputs.get(category, {}).items():
                specs.setdefault(name, (spec[0], spec[1] if len(spec) > 1 else {}, category))
        custom = [name for (cls, name) in FILE_INPUTS if cls == class_type]
        errors: list[dict[str, Any]] = []
        valid = True
        for x, (input_type, extra_info, category) in specs.items():
            if x not in inputs:
                if category == "required":
                    errors.append(
                        {
                            "type": "required_input_missing",
                            "message": "Required input is missing",
                            "details": f"{x}",
                            "extra_info": {"input_name": x},
                        }
                    )
                continue
            val = inputs[x]
            info = [input_type, extra_info]
            if isinstance(val, list):
                if len(val) != 2:
                    errors.append(
                        {
                            "type": "bad_linked_input",
                            "message": "Bad linked input, must be a length-2 list of [node_id, slot_index]",
                            "details": f"{x}",
                            "extra_info": {"input_name": x, "input_config": info, "received_value": val},
                        }
                    )
                    continue
                o_id = val[0]
                o_class_type = prompt[o_id]["class_type"]
                received_type = tuple(NODE_INFO[o_class_type]["output"])[val[1]]
                if not types_match(received_type, input_type):
                    details = f"{x}, received_type({received_type}) mismatch input_type({input_type})"
                    errors.append(
                        {
                            "type": "return_type_mismatch",
                            "message": "Return type mismatch between linked nodes",
                            "details": details,
                            "extra_info": {
                                "input_name": x,
                                "input_config": info,
                                "received_type": received_type,
                                "linked_node": val,
                            },
                        }
                    )
                    continue
                try:
                    r = self._inputs(prompt, o_id, validated)
                    if r[0] is False:
                        valid = False
                        continue
                except Exception as ex:
                    valid = False
                    reasons = [
                        {
                            "type": "exception_during_inner_validation",
                            "message": "Exception when validating inner node",
                            "details": str(ex),
                            "extra_info": {
                                "input_name": x,
                                "input_config": info,
                                "exception_message": str(ex),
                                "exception_type": full_type_name(ex),
                                "traceback": list(VALIDATION_FRAMES),
                                "linked_node": val,
                            },
                        }
                    ]
                    validated[o_id] = (False, reasons, o_id)
                    continue
            else:
                try:
                    if isinstance(val, dict) and "__value__" in val:
                        val = inputs[x] = val["__value__"]
                    if input_type == "INT":
                        val = inputs[x] = int(val)
                    if input_type == "FLOAT":
                        val = inputs[x] = float(val)
                    if input_type == "STRING":
                        val = inputs[x] = str(val)
                    if input_type == "BOOLEAN":
                        val = inputs[x] = bool(val)
                except Exception as ex:
                    errors.append(
                        {
                            "type": "invalid_input_type",
                            "message": f"Failed to convert an input value to a {input_type} value",
                            "details": f"{x}, {val}, {ex}",
                            "extra_info": {
                                "input_name": x,
                                "input_config": info,
                                "received_value": val,
                                "exception_message": str(ex),
                            },
                        }
                    )
                    continue
                if x in custom:
                    continue
                if "min" in extra_info and val < extra_info["min"]:
                    errors.append(
                        {
                            "type": "value_smaller_than_min",
                            "message": "Value {} smaller than min of {}".format(val, extra_info["min"]),
                            "details": f"{x}",
                            "extra_info": {"input_name": x, "input_config": info, "received_value": val},
                        }
                    )
                    continue
                if "max" in extra_info and val > extra_info["max"]:
                    errors.append(
                        {
                            "type": "value_bigger_than_max",
                            "message": "Value {} bigger than max of {}".format(val, extra_info["max"]),
                            "details": f"{x}",
                            "extra_info": {"input_name": x, "input_config": info, "received_value": val},
                        }
                    )
                    continue
                if isinstance(input_type, list) or input_type == "COMBO":
                    if (class_type, x) in MODEL_INPUTS and self.any_model_name:
                        continue
                    options = extra_info.get("options", []) if input_type == "COMBO" else input_type
                    if val not in options:
                        input_config: Any = info
                        if len(options) > 20:
                            list_info = f"(list of length {len(options)})"
                            input_config = None
                        else:
                            list_info = str(options)
                        errors.append(
                            {
                                "type": "value_not_in_list",
                                "message": "Value not in list",
                                "details": f"{x}: '{val}' not in {list_info}",
                                "extra_info": {"input_name": x, "input_config": input_config, "received_value": val},
                            }
                        )
                        continue
        for x in custom:
            if x in inputs and not isinstance(inputs[x], list):
                _, message = FILE_INPUTS[(class_type, x)]
                if not self.file_exists(inputs[x]):
                    errors.append(
                        {
                            "type": "custom_validation_failed",
                            "message": "Custom validation failed for node",
                            "details": f"{x} - {message.format(inputs[x])}",
                            "extra_info": {"input_name": x},
                        }
                    )
        result = (False, errors, uid) if errors or valid is not True else (True, [], uid)
        validated[uid] = result
        return result


def types_match(received: Any, expected: Any) -> bool:
    """execution.validate_node_input (non-strict)."""
    if not received != expected:
        return True
    if not isinstance(received, str) or not isinstance(expected, str):
        return False
    r = {t.strip() for t in received.split(",")}
    e = {t.strip() for t in expected.split(",")}
    return "*" in r or "*" in e or bool(r & e)
