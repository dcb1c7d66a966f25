import Testing

@testable import PylonHost

@Suite struct PluginOutputTests {
    @Test func aSwiftCrashReportIsCondensedToItsReason() {
        var f = PluginOutputFilter()
        #expect(f.take("") == .drop)
        #expect(f.take("ts=2026 level=info msg=x") == .relay)
        #expect(f.take("*** Signal 6: Backtracing from 0x7f3d7ffe2eec... done ***") == .debug)
        #expect(f.take("") == .drop)
        #expect(f.take("*** Program crashed: Aborted at 0x0000000000002b30 ***") == .debug)
        #expect(f.take("Thread 0 \"pylon-echo\" crashed:") == .debug)
        #expect(f.take("rax 0x0000000000000000  0") == .debug)
        #expect(f.crashReason == "Aborted at 0x0000000000002b30")
        #expect(f.take("ts=2026 level=info msg=still-logfmt") == .relay)
    }

    @Test func ordinaryStderrIsRelayedAndFatalErrorsKept() {
        var f = PluginOutputFilter()
        #expect(f.take("hello from stderr") == .relay)
        #expect(f.crashReason == nil)
        #expect(f.take("main.swift:12: Fatal error: boom") == .debug)
        #expect(f.crashReason == "main.swift:12: Fatal error: boom")
        #expect(f.take("*** Signal 4: Backtracing from 0x1... done ***") == .debug)
        #expect(f.take("*** Program crashed: Illegal instruction at 0x1 ***") == .debug)
        #expect(f.crashReason == "main.swift:12: Fatal error: boom")
    }

    @Test func anSdDaemonPrefixSetsTheLevelAndIsRemoved() {
        var f = PluginOutputFilter()
        #expect(f.classify("<3>disk full") == (.relay, .error, "disk full"))
        #expect(f.classify("<4>careful") == (.relay, .warn, "careful"))
        #expect(f.classify("<5>notice") == (.relay, .info, "notice"))
        #expect(f.classify("<6>ts=2026 level=info msg=x") == (.relay, .info, "ts=2026 level=info msg=x"))
        #expect(f.classify("<7>details") == (.relay, .debug, "details"))
        #expect(f.classify("<0>emergency") == (.relay, .error, "emergency"))
        // Without a prefix (or with something that only looks like one): info, the text as it is.
        #expect(f.classify("plain stderr") == (.relay, .info, "plain stderr"))
        #expect(f.classify("<8>not a priority") == (.relay, .info, "<8>not a priority"))
        #expect(f.classify("<4") == (.relay, .info, "<4"))
        #expect(f.classify("<42>x") == (.relay, .info, "<42>x"))
        #expect(f.classify("<4>") == (.drop, .warn, ""))
        #expect(f.classify("<3>main.swift:1: Fatal error: boom") == (.debug, .debug, "main.swift:1: Fatal error: boom"))
        #expect(f.crashReason == "main.swift:1: Fatal error: boom")
    }
}
