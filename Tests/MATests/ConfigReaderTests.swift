import PylonCore
import Testing

@testable import PylonPluginKit
@testable import pylon_ma

/// The plugin kit's strict config reader and MA's settings read with it: wrong types and values
/// out of bounds are errors named by path, unknown settings warnings (errors under --check-config),
/// absent ones the defaults.
@Suite struct ConfigReaderTests {
    @Test func typesAndBoundsAreErrorsNamedByPath() throws {
        var r = ConfigReader(["n": "lots", "b": 1, "u": "ftp://x", "c": "loud", "o": [1], "ok": 5])
        #expect(r.int("n", 1...10) == nil)
        #expect(r.bool("b") == nil)
        #expect(r.httpURL("u") == nil)
        #expect(r.choice("c", ["quiet", "normal"]) == nil)
        #expect(r.object("o") == nil)
        #expect(r.int("ok", 1...10) == 5)
        #expect(
            r.problems == [
                "config.n: must be an integer from 1 to 10", "config.b: must be true or false",
                "config.u: scheme ftp is not allowed (only http and https)",
                "config.c: must be one of \"quiet\", \"normal\"", "config.o: must be an object",
            ])
        #expect(throws: ConfigProblems.self) { try r.check() }
    }

    @Test func absentAndNullMeanTheDefaultAndUnknownKeysWarn() throws {
        var r = ConfigReader(["a": .null, "typo": 1])
        #expect(r.int("a", 1...2) == nil)
        #expect(r.int("missing", 1...2) == nil)
        #expect(r.problems.isEmpty)
        #expect(r.unknown == ["config.typo: unknown setting"])
        try r.check()
        var notObject = ConfigReader([1, 2])
        #expect(notObject.problems == ["config: must be an object"])
        _ = notObject.string("x")
    }

    @Test func urlRules() {
        #expect(ConfigReader.httpURLProblem("https://backend.example/v1") == nil)
        #expect(ConfigReader.httpURLProblem("http://127.0.0.1:8780") == nil)
        #expect(ConfigReader.httpURLProblem("backend.example") != nil)
        #expect(ConfigReader.httpURLProblem("http://user:pw@host") != nil)
        #expect(ConfigReader.httpURLProblem("http:///path") != nil)
        #expect(ConfigReader.httpURLProblem("http://ho st") != nil)
    }

    @Test func maConfigIsStrict() throws {
        let c = try MAConfig(["backend": "http://b:1", "retryInitialMs": 100, "maxAppKeys": 3, "extra": true])
        #expect(c.backend == "http://b:1" && c.retryInitialMs == 100 && c.maxAppKeys == 3)
        #expect(c.warnings == ["config.extra: unknown setting"])
        #expect(try MAConfig(.object([:])).maxHeldEvents == MAConfig().maxHeldEvents)
        for bad: JSON in [["retryMaxMs": "soon"], ["maxAppKeys": 0], ["backend": "ftp://x"], ["retryInitialMs": 10, "retryMaxMs": 5]] {
            #expect(throws: ConfigProblems.self, "\(bad)") { _ = try MAConfig(bad) }
        }
    }
}
