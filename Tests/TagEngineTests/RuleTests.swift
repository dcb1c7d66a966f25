import PylonCore
import Testing

@testable import PylonTagEngine

@Suite struct RuleTests {
    /// Macros: 0 = event, 1 = screenName; predicates: 0 event == openScreen,
    /// 1 screenName == Confirmation, 2 screenName == Blocked.
    let base: (macros: [JSON], predicates: [JSON]) = (
        [["function": "_e", "instance_name": "event"], ["function": "_v", "instance_name": "screen", "name": "screenName"]],
        [
            ["function": "_eq", "arg0": ["macro", 0], "arg1": "openScreen"],
            ["function": "_eq", "arg0": ["macro", 1], "arg1": "Confirmation"],
            ["function": "_eq", "arg0": ["macro", 1], "arg1": "Blocked"],
        ]
    )

    @Test func ruleNeedsEveryIfAndNoUnless() {
        let c = container(macros: base.macros, predicates: base.predicates, rules: [[["if", 0, 1]], [["if", 0], ["unless", 2]]])
        #expect(c.rulePasses(0, context: ctx(["screenName": "Confirmation"], event: "openScreen")))
        #expect(!c.rulePasses(0, context: ctx(["screenName": "Home"], event: "openScreen")))
        #expect(c.rulePasses(1, context: ctx(["screenName": "Home"], event: "openScreen")))
        #expect(!c.rulePasses(1, context: ctx(["screenName": "Blocked"], event: "openScreen")))
    }

    @Test func negativesAreEvaluatedFirstAndShortCircuit() {
        // The positive predicate calls a function-call macro; when the unless predicate is
        // true, it is never asked for.
        let c = container(
            macros: [
                ["function": "_func", "instance_name": "f", "function_call_macro_name": "costly"],
                ["function": "_c", "instance_name": "yes", "value": "y"],
            ],
            predicates: [
                ["function": "_eq", "arg0": ["macro", 0], "arg1": "1"],
                ["function": "_eq", "arg0": ["macro", 1], "arg1": "y"],
            ],
            tags: [["function": "_func", "name": "t"]],
            rules: [[["if", 0], ["unless", 1], ["add", 0]]])
        var cx = ctx(event: "e")
        cx.registeredMacros = ["costly"]
        let t = c.tagsToFire(context: cx)
        #expect(t.tags.isEmpty)
        #expect(t.pending.isEmpty, "the positive predicate was not evaluated")
    }

    @Test func tagsAreAddsMinusBlocks() {
        let tags: [JSON] = [
            ["function": "_func", "name": "t0"], ["function": "_func", "name": "t1"], ["function": "_func", "name": "t2"],
        ]
        let c = container(
            macros: base.macros, predicates: base.predicates, tags: tags,
            rules: [[["if", 0], ["add", 0, 1]], [["if", 1], ["add", 2], ["block", 1]], [["if", 2], ["add", 1]]])
        let open = c.tagsToFire(context: ctx(["screenName": "Home"], event: "openScreen")).tags.map(\.index)
        #expect(open == [0, 1])
        let confirm = c.tagsToFire(context: ctx(["screenName": "Confirmation"], event: "openScreen")).tags.map(\.index)
        #expect(confirm == [0, 2], "the block of a passing rule removes t1 even though another rule adds it")
        #expect(c.tagsToFire(context: ctx(["screenName": "Home"], event: "other")).tags.isEmpty)
    }

    @Test func tagPropertiesAreEvaluated() {
        let c = container(
            macros: base.macros, predicates: base.predicates,
            tags: [["function": "_func", "name": "track", "additional_params": ["screen": ["macro", 1], "ev": ["macro", 0]]]],
            rules: [[["if", 0], ["add", 0]]])
        let t = c.tagsToFire(context: ctx(["screenName": "Home"], event: "openScreen")).tags
        #expect(t.count == 1)
        #expect(t[0].function == .functionCall)
        #expect(t[0].properties["name"] == "track")
        #expect(t[0].properties["additional_params"] == ["screen": "Home", "ev": "openScreen"])
    }

    @Test func macroSelectionByRules() {
        // Three definitions of "greeting": Italian and Spanish enabled by language rules, and an
        // English default.
        let c = container(
            macros: [
                ["function": "_l", "instance_name": "lang"],
                ["function": "_c", "instance_name": "greeting", "value": "Ciao", "not_default_macro": true],
                ["function": "_c", "instance_name": "greeting", "value": "Hola", "not_default_macro": true],
                ["function": "_c", "instance_name": "greeting", "value": "Hello"],
            ],
            predicates: [
                ["function": "_eq", "arg0": ["macro", 0], "arg1": "it"],
                ["function": "_eq", "arg0": ["macro", 0], "arg1": "es"],
                ["function": "_sw", "arg0": ["macro", 0], "arg1": "e"],
            ],
            rules: [[["if", 0], ["add_macro", 1]], [["if", 1], ["add_macro", 2]], [["if", 2], ["block_macro", 2]]])
        func greet(_ l: String) -> String {
            var e = TagEnvironment()
            e.language = l
            return str(c, "greeting", ctx(env: e))
        }
        #expect(greet("IT") == "Ciao")
        #expect(greet("fr") == "Hello")
        #expect(greet("es") == "Hello", "es is added by rule 1 and blocked by rule 2: the default applies")
    }

    @Test func severalEnabledDefinitionsPickTheLowestIndexWithAWarning() {
        let c = container(
            macros: [
                ["function": "_c", "instance_name": "v", "value": "first", "not_default_macro": true],
                ["function": "_c", "instance_name": "v", "value": "second", "not_default_macro": true],
            ],
            predicates: [["function": "_eq", "arg0": "a", "arg1": "a"]],
            rules: [[["if", 0], ["add_macro", 1, 0]]])
        let e = c.value(named: "v", context: ctx())
        #expect(e.value == "first")
        #expect(e.warnings.contains { $0.contains("Multiple macros active for macroName v") })
    }

    @Test func noDefaultDefinitionIsUnresolved() {
        let c = container(macros: [["function": "_c", "instance_name": "v", "value": "x", "not_default_macro": true]])
        #expect(value(c, "v") == nil)
    }

    @Test func badReferencesWarnAndNeverPass() {
        let c = container(
            predicates: [["function": "_eq", "arg0": ["macro", 9], "arg1": "a"]],
            tags: [["function": "_func"]],
            rules: [[["if", 5], ["add", 0]], [["if", 0], ["add", 0, 7]], "junk", [["frob", 1]]])
        #expect(c.warnings.contains { $0.contains("macro reference 9 out of range") })
        #expect(c.warnings.contains { $0.contains("rule 0: if index 5 out of range") })
        #expect(c.warnings.contains { $0.contains("rule 1: add index 7 out of range") })
        #expect(c.warnings.contains { $0.contains("rule 2 is not an array") })
        #expect(c.warnings.contains { $0.contains("unknown clause frob") })
        #expect(c.tagsToFire(context: ctx(event: "e")).tags.isEmpty)
    }

    @Test func templatesListsAndMaps() {
        let c = container(macros: [
            ["function": "_v", "instance_name": "name", "name": "user"],
            ["function": "_c", "instance_name": "t", "value": ["template", "Hi ", ["macro", 0], "! You are ", 7, "."]],
            ["function": "_c", "instance_name": "l", "value": ["list", "a", ["macro", 0], 1]],
            ["function": "_c", "instance_name": "m", "value": ["map", "k", ["macro", 0], ["macro", 0], true]],
            ["function": "_c", "instance_name": "o", "value": ["nested": ["macro", 0]]],
            ["function": "_c", "instance_name": "e", "value": ["escape", ["macro", 0], 3]],
        ])
        let cx = ctx(["user": "Ann"])
        #expect(value(c, "t", cx) == "Hi Ann! You are 7.")
        #expect(value(c, "l", cx) == ["a", "Ann", 1])
        #expect(value(c, "m", cx) == ["k": "Ann", "Ann": true])
        #expect(value(c, "o", cx) == ["nested": "Ann"])
        #expect(value(c, "e", cx) == "Ann")
        #expect(value(c, "t") == "Hi ! You are 7.", "an unresolved part is empty")
        #expect(str(c, "l", cx) == "[\"a\",\"Ann\",1]", "lists convert to JSON strings")
    }

    @Test func macroCyclesYieldTheDefaultWithAWarning() {
        let c = container(macros: [
            ["function": "_c", "instance_name": "a", "value": ["template", "a", ["macro", 1]]],
            ["function": "_c", "instance_name": "b", "value": ["template", "b", ["macro", 0]]],
            ["function": "_c", "instance_name": "self", "value": ["macro", 2]],
        ])
        let e = c.value(named: "a", context: ctx())
        #expect(e.value == nil, "a macro in a cycle is unresolved, not what it built before the cycle closed")
        #expect(e.warnings.contains { $0.contains("Macro cycle detected: a") })
        let s = c.value(named: "self", context: ctx())
        #expect(s.value == nil)
        #expect(s.warnings.contains { $0.contains("Macro cycle detected: self") })
    }

    @Test func cyclesThroughRuleSelectionTerminate() {
        // The definition of "x" is chosen by a rule whose predicate reads "x".
        let c = container(
            macros: [
                ["function": "_c", "instance_name": "x", "value": "1", "not_default_macro": true],
                ["function": "_c", "instance_name": "x", "value": "2"],
            ],
            predicates: [["function": "_eq", "arg0": ["macro", 0], "arg1": "2"]],
            rules: [[["if", 0], ["add_macro", 0]]])
        let e = c.value(named: "x", context: ctx())
        #expect(e.value == nil, "x's selection reads x: a cycle, so the type default")
        #expect(e.warnings.contains { $0.contains("Macro cycle detected: x") })
    }

    @Test func deepChainsStopAtTheDepthLimit() {
        var macros: [JSON] = []
        for i in 0..<100 {
            macros.append(["function": "_c", "instance_name": .string("m\(i)"), "value": i == 99 ? "end" : ["macro", .int(Int64(i + 1))]])
        }
        let c = container(macros: macros)
        let e = c.value(named: "m0", context: ctx())
        #expect(e.value == nil)
        #expect(e.warnings.contains { $0.contains("deeper than") })
        #expect(value(c, "m80") == "end")
    }

    /// The step budget ends it, whatever the budget: how long that takes is
    /// `Benchmarks/engine-worst-cases.sh`'s to say (it was a 2 s bound here).
    @Test func workLimitStopsExponentialTemplates() throws {
        // Each macro references the previous one twice: 2^30 expansions.
        var macros: [JSON] = [["function": "_r", "instance_name": "m0"]]
        for i in 1..<30 {
            macros.append([
                "function": "_c", "instance_name": .string("m\(i)"),
                "value": ["list", ["macro", .int(Int64(i - 1))], ["macro", .int(Int64(i - 1))]],
            ])
        }
        let resource: JSON = ["resource": ["version": "7", "macros": .array(macros), "predicates": [], "tags": [], "rules": []]]
        for budget in [EngineLimits().maxSteps, 1_000] {
            var limits = EngineLimits()
            limits.maxSteps = budget
            let e = try Container.parse(full: resource, limits: limits).value(named: "m29", context: ctx())
            #expect(e.stop == .steps, "budget \(budget): \(e.warnings)")
            #expect(e.value == nil)
            #expect(e.warnings.contains("evaluation stopped: work limit of \(budget) steps reached"))
        }
    }
}
