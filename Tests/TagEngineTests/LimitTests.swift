import PylonCore
import Testing

@testable import PylonTagEngine

/// Macros `m0 = "a"`, `m<i> = m<i-1> + m<i-1>`: `m<n>` is 2^n bytes (named, so each level is
/// built once).
func doubling(_ n: Int) -> [JSON] {
    var macros: [JSON] = [["function": "_c", "instance_name": "m0", "value": "a"]]
    for i in 1...n {
        macros.append([
            "function": "_c", "instance_name": .string("m\(i)"),
            "value": ["template", ["macro", .int(Int64(i - 1))], ["macro", .int(Int64(i - 1))]],
        ])
    }
    return macros
}

@Suite struct CycleTests {
    /// Issue 22 item 3: every cycle, however reached, is the type default.
    @Test func aCycleThroughATemplateIsUnresolved() {
        let c = container(macros: [
            ["function": "_c", "instance_name": "t0", "value": ["template", "x", ["macro", 1]]],
            ["function": "_c", "instance_name": "t1", "value": ["template", "y", ["macro", 0]]],
            ["function": "_c", "instance_name": "outside", "value": ["template", "o", ["macro", 0]]],
        ])
        let e = c.value(named: "t0", context: ctx())
        #expect(e.value == nil)
        #expect(e.warnings.contains { $0.contains("Macro cycle detected") })
        #expect(value(c, "t1") == nil)
        #expect(e.converted(to: .string).value == "")
        // A macro that only refers to a cycle is not in it: the cycle's part is unresolved ("").
        #expect(value(c, "outside") == "o")
    }

    @Test func aCycleThroughAListOrAMapIsUnresolved() {
        let c = container(macros: [
            ["function": "_c", "instance_name": "l0", "value": ["list", "p", ["macro", 1]]],
            ["function": "_c", "instance_name": "l1", "value": ["list", "q", ["macro", 0]]],
            ["function": "_c", "instance_name": "o0", "value": ["map", "k", ["macro", 3]]],
            ["function": "_c", "instance_name": "o1", "value": ["map", "k", ["macro", 2]]],
            ["function": "_jn", "instance_name": "j", "arg0": ["list", "a", ["macro", 4]]],
        ])
        #expect(value(c, "l0") == nil)
        #expect(value(c, "l1") == nil)
        #expect(value(c, "o0") == nil)
        #expect(value(c, "j") == nil, "a joiner over itself")
    }

    @Test func aRingLongerThanTheDepthLimitIsUnresolved() {
        var macros: [JSON] = []
        for i in 0..<50 {
            macros.append([
                "function": "_c", "instance_name": .string("r\(i)"), "value": ["template", "x", ["macro", .int(Int64((i + 1) % 50))]],
            ])
        }
        let c = container(macros: macros)
        #expect(value(c, "r0") == nil, "not 32 × x")
        #expect(value(c, "r17") == nil)
    }

    @Test func aNonCyclicChainAndReuseStillResolve() {
        let c = container(macros: [
            ["function": "_c", "instance_name": "a", "value": "A"],
            ["function": "_c", "instance_name": "b", "value": ["template", ["macro", 0], ["macro", 0]]],
            ["function": "_c", "instance_name": "c", "value": ["list", ["macro", 1], ["macro", 0]]],
        ])
        #expect(value(c, "c") == ["AA", "A"])
    }
}

@Suite struct WorkLimitTests {
    /// Issue 21 item 5: a 1 MiB string by doubling, an unnamed `_hsh` over it and a `_jn`
    /// listing that macro 30,000 times (the 452 KB container that stalled the plugin 10.6 s).
    @Test func theReportedContainerStopsWithALimit() {
        var macros = doubling(20)
        macros.append(["function": "_hsh", "arg0": ["macro", 20]])  // unnamed: index 21
        macros.append([
            "function": "_jn", "instance_name": "j",
            "arg0": .array([.string("list")] + Array(repeating: ["macro", 21], count: 30_000)),
        ])
        let c = container(macros: macros)
        let e = c.value(named: "j", context: ctx())
        #expect(e.stop != nil)
        #expect(e.value == nil)
    }

    /// Work that caching cannot save: distinct hashes of 1 MiB inputs. The byte budget stops it.
    @Test func bytesProducedAndHashedAreBounded() {
        var macros = doubling(20)
        var refs: [JSON] = ["list"]
        for i in 0..<12 {
            macros.append(["function": "_hsh", "arg0": ["template", ["macro", 20], .string("\(i)")]])
            refs.append(["macro", .int(Int64(macros.count - 1))])
        }
        macros.append(["function": "_jn", "instance_name": "j", "arg0": .array(refs)])
        let c = container(macros: macros)
        let e = c.value(named: "j", context: ctx())
        #expect(e.stop == .workBytes)
        #expect(e.value == nil)
        #expect(e.warnings.contains { $0.contains("bytes produced and hashed") })
        // Under the budget the same container answers.
        var few = doubling(20)
        few.append(["function": "_hsh", "instance_name": "h", "arg0": ["macro", 20]])
        #expect(container(macros: few).value(named: "h", context: ctx()).value?.stringValue?.count == 32)
    }

    /// Issue 22 item 4: a value larger than `maxValueBytes` is a stop, not a huge answer.
    @Test func aValueTooLargeToAnswerIsAStop() {
        let c = container(macros: doubling(20))
        let big = c.value(named: "m20", context: ctx())
        #expect(big.stop == .valueBytes)
        #expect(big.value == nil)
        #expect(c.value(named: "m10", context: ctx()).value?.stringValue?.utf8.count == 1024)
        // A list doubled 29 times.
        var macros: [JSON] = [["function": "_c", "instance_name": "l0", "value": "x"]]
        for i in 1..<30 {
            macros.append([
                "function": "_c", "instance_name": .string("l\(i)"),
                "value": ["list", ["macro", .int(Int64(i - 1))], ["macro", .int(Int64(i - 1))]],
            ])
        }
        let l = container(macros: macros).value(named: "l29", context: ctx())
        #expect(l.stop != nil)
        #expect(l.value == nil)
    }

    @Test func jsonSizeIsBoundedAndAnUpperBound() {
        let s = String(repeating: "a", count: 1 << 20)
        #expect(TagConversion.jsonSize(.string(s), limit: 1000) == nil)
        let v: JSON = ["k": ["a\"b/", 1, 2.5, true, .null]]
        let n = TagConversion.jsonSize(v, limit: 1000)
        #expect(n != nil && n! >= v.serialized.utf8.count)
        let wide = JSON.array(Array(repeating: .string(s), count: 100_000))
        #expect(TagConversion.jsonSize(wide, limit: 1 << 20) == nil)
    }
}

@Suite struct LineRateLimiterTests {
    @Test func aBurstThenARateAndTheSuppressedCountIsReported() {
        var l = LineRateLimiter(burst: 3, perSecond: 2)
        #expect(l.request(nowMs: 0) == .emit(suppressedBefore: 0))
        #expect(l.request(nowMs: 0) == .emit(suppressedBefore: 0))
        #expect(l.request(nowMs: 0) == .emit(suppressedBefore: 0))
        for _ in 0..<100 { #expect(l.request(nowMs: 10) == .suppress) }
        #expect(l.request(nowMs: 510) == .emit(suppressedBefore: 100), "one token after 500 ms at 2/s")
        #expect(l.request(nowMs: 510) == .suppress)
        #expect(l.totalSuppressed == 101)
        // A clock that goes back does not mint tokens.
        #expect(l.request(nowMs: 0) == .suppress)
    }
}
