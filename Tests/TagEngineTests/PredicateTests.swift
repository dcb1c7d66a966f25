import PylonCore
import Testing

@testable import PylonTagEngine

@Suite struct PredicateTests {
    @Test func equalsIsExactAndCaseSensitive() {
        #expect(pred("_eq", "openScreen", "openScreen"))
        #expect(!pred("_eq", "openScreen", "openscreen"))
        #expect(pred("_eq", "openScreen", "OPENSCREEN", ignoreCase: true))
        #expect(!pred("_eq", "a", "a "))
        #expect(pred("_eq", 12, "12"), "string forms compare")
        #expect(pred("_eq", true, "true"))
        #expect(!pred("_eq", 1.0, "1"), "a double's string form is 1.0")
    }

    @Test func containsStartsWithEndsWith() {
        #expect(pred("_cn", "Home Screen", "me Sc"))
        #expect(!pred("_cn", "Home Screen", "me sc"))
        #expect(pred("_cn", "Home Screen", "ME SC", ignoreCase: true))
        #expect(pred("_cn", "abc", ""), "the empty string is contained")
        #expect(pred("_sw", "Home Screen", "Home"))
        #expect(!pred("_sw", "Home Screen", "home"))
        #expect(pred("_sw", "Home Screen", "home", ignoreCase: true))
        #expect(!pred("_sw", "Ho", "Home"))
        #expect(pred("_ew", "Home Screen", "Screen"))
        #expect(!pred("_ew", "Screen", "Home Screen"))
        #expect(pred("_ew", "Home Screen", "SCREEN", ignoreCase: true))
        #expect(pred("_ew", "héllo", "llo"), "UTF-8 strings")
    }

    @Test func regexIsAPartialMatchWithIgnoreCase() {
        #expect(pred("_re", "Home Screen", "me\\s+S"))
        #expect(!pred("_re", "Home Screen", "^Screen"))
        #expect(pred("_re", "Home Screen", "^home", ignoreCase: true))
        #expect(!pred("_re", "Home Screen", "^home"))
        #expect(pred("_re", "é", "^.$"), "UTF mode: one character")
    }

    @Test func invalidRegexIsFalseWithAWarning() {
        let c = container(predicates: [["function": "_re", "arg0": "x", "arg1": "(unclosed"]])
        #expect(c.warnings.contains { $0.contains("invalid regex") })
        #expect(!c.predicateValue(0, context: ctx()).0)
    }

    /// PCRE2's match limit ends the backtracking ("gave up"), not the end of the search; how
    /// long that takes is `Benchmarks/engine-worst-cases.sh`'s to say (it was a 1 s bound here).
    @Test func catastrophicRegexGivesUpQuickly() {
        let subject = JSON.string(String(repeating: "a", count: 40) + "!")
        let c = container(predicates: [
            ["function": "_re", "arg0": subject, "arg1": "^(a+)+$"],
            ["function": "_re", "arg0": subject, "arg1": "^(a|aa)+$"],
        ])
        let (r, w) = c.predicateValue(0, context: ctx())
        #expect(!r)
        #expect(w.contains { $0.contains("gave up") })
        let (r1, w1) = c.predicateValue(1, context: ctx())
        #expect(!r1)
        #expect(w1.contains { $0.contains("gave up") })
    }

    @Test func numericPredicatesParseBothSides() {
        #expect(pred("_lt", 1, 2))
        #expect(!pred("_lt", 2, 2))
        #expect(pred("_le", 2, 2))
        #expect(pred("_gt", "10", "9"), "numeric, not lexical")
        #expect(pred("_ge", "2.5", 2.5))
        #expect(pred("_lt", "-3", "1e1"))
        #expect(!pred("_lt", "abc", 5), "unparsable → false")
        #expect(!pred("_gt", 5, "abc"))
        #expect(!pred("_ge", true, 0), "booleans are not numbers")
        #expect(pred("_gt", 9_007_199_254_740_993, 9_007_199_254_740_992), "int64 compared exactly")
        #expect(!pred("_lt", "nan", 1))
    }

    @Test func negateInvertsAndUnresolvedIsFalse() {
        #expect(pred("_eq", "a", "b", negate: true))
        #expect(!pred("_eq", "a", "a", negate: true))
        // Unresolved argument (missing data-layer key): false, negate or not.
        let c = container(
            macros: [["function": "_v", "instance_name": "missing", "name": "nope"]],
            predicates: [
                ["function": "_eq", "arg0": ["macro", 0], "arg1": ""],
                ["function": "_eq", "arg0": ["macro", 0], "arg1": "", "negate": true],
            ])
        #expect(!c.predicateValue(0, context: ctx()).0)
        #expect(!c.predicateValue(1, context: ctx()).0)
    }

    @Test func missingArgumentIsFalseWithWarning() {
        let c = container(predicates: [["function": "_eq", "arg0": "a"]])
        let (r, w) = c.predicateValue(0, context: ctx())
        #expect(!r)
        #expect(w.contains { $0.contains("Incorrect keys") && $0.contains("arg1") })
    }

    @Test func nonPredicateFunctionIsFalse() {
        let c = container(predicates: [["function": "_c", "arg0": "a", "arg1": "a"], ["function": "_zz", "arg0": "a", "arg1": "a"]])
        #expect(!c.predicateValue(0, context: ctx()).0)
        #expect(!c.predicateValue(1, context: ctx()).0)
        #expect(c.warnings.contains { $0.contains("_zz has no backing implementation") })
    }
}
