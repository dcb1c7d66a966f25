import PylonCore

@testable import PylonTagEngine

/// A container from a resource literal.
func container(macros: [JSON] = [], predicates: [JSON] = [], tags: [JSON] = [], rules: [JSON] = [], version: String = "7") -> Container {
    try! Container.parse(full: [
        "resource": [
            "version": .string(version), "macros": .array(macros), "predicates": .array(predicates),
            "tags": .array(tags), "rules": .array(rules),
        ]
    ])
}

func ctx(_ dl: JSONObject = [:], event: String? = nil, env: TagEnvironment = TagEnvironment()) -> EvaluationContext {
    EvaluationContext(environment: env, dataLayer: DataLayer(dl), event: event, nowMs: 1_700_000_000_000, seed: 42)
}

/// Evaluates predicate 0 of a one-predicate container comparing `a` with `b`.
func pred(_ fn: String, _ a: JSON, _ b: JSON, ignoreCase: Bool = false, negate: Bool = false) -> Bool {
    var p: JSONObject = ["function": .string(fn), "arg0": a, "arg1": b]
    if ignoreCase { p["ignore_case"] = true }
    if negate { p["negate"] = true }
    return container(predicates: [.object(p)]).predicateValue(0, context: ctx()).0
}

func value(_ c: Container, _ name: String, _ cx: EvaluationContext = ctx()) -> JSON? { c.value(named: name, context: cx).value }

func str(_ c: Container, _ name: String, _ cx: EvaluationContext = ctx()) -> String {
    TagConversion.toString(value(c, name, cx))
}
