import Testing

@testable import PylonCore

#if canImport(Glibc)
import Glibc
#endif

@Suite struct LogOutputTests {
    @Test func logfmtLinesParseBackIntoTheirFields() {
        let pairs = Log.parseLogfmt(
            #"ts=2026-01-01T00:00:00.000Z level=warn component=uploader msg="batch failed" stream=ma.k status=503 reason="a \"quoted\" word\nnext""#
        )
        #expect(pairs.map { $0.0 } == ["ts", "level", "component", "msg", "stream", "status", "reason"])
        #expect(pairs[3].1 == "batch failed")
        #expect(pairs[6].1 == "a \"quoted\" word\nnext")
    }

    @Test func journalFieldNamesAreUpperCaseAndSafe() {
        #expect(Log.journalFieldName("in_ms") == "IN_MS")
        #expect(Log.journalFieldName("queued-bytes") == "QUEUED_BYTES")
        #expect(Log.journalFieldName("") == "FIELD")
    }

    @Test func journalOnlyWhenJournalStreamIsStderr() {
        var st = stat()
        fstat(2, &st)
        let mine = "\(st.st_dev):\(st.st_ino)"
        #expect(Log.detectOutput { $0 == "JOURNAL_STREAM" ? mine : nil } == .journal)
        #expect(Log.detectOutput { $0 == "JOURNAL_STREAM" ? "1:2" : nil } == .logfmt)
        #expect(Log.detectOutput { _ in nil } == .logfmt)
        #expect(Log.detectOutput { $0 == "PYLON_LOG_FORMAT" ? "prefixed" : ($0 == "JOURNAL_STREAM" ? mine : nil) } == .prefixed)
    }

    @Test func syslogPriorities() {
        #expect([Log.Level.debug, .info, .warn, .error].map(\.syslogPriority) == [7, 6, 4, 3])
    }

    /// Characters that forge or disguise a log line are escaped; other text is kept.
    @Test func disguisingCharactersAreEscaped() {
        #expect(Log.quote("a\u{2028}b\u{202E}c\u{7F}d\u{85}e\u{2066}f") == #""a\u{2028}b\u{202e}c\u{7f}d\u{85}e\u{2066}f""#)
        #expect(Log.quote("plain") == "plain")
        #expect(Log.quote("café") == #""café""#, "other text is kept (quoted)")
        #expect(Log.escapingDisguises("ts=1 msg=\"x\u{2029}y\"") == #"ts=1 msg="x\u{2029}y""#)
    }
}
