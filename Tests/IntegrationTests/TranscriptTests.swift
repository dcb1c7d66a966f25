import Foundation
import PylonClientKit
import PylonProtocol
import TestSupport
import Testing

/// Recorded client↔host exchanges, replayed against the real host and the echo plugin with the
/// replies compared byte for byte (docs/TESTING.md, "Wire transcripts").
///
/// A transcript (`Tests/fixtures/transcripts/NAME.ndjson`) is one JSON object a line:
/// `{"send": TEXT}` is a line the client writes (any text, valid JSON or not), each
/// `{"recv": TEXT}` after it a line the host answers, exactly; `{"note": TEXT}` is a comment.
/// After the last step a `bus.ping` must be answered next: nothing unexpected came in between.
/// `PYLON_RECORD_TRANSCRIPTS=1 swift test --filter TranscriptTests` rewrites the `recv` lines
/// from the host's answers, as many per `send` as the file has (review the diff before
/// committing it).
@Suite(.serialized) struct TranscriptTests {
    enum Step: Equatable {
        case send(String)
        case recv(String)
        case note(String)
    }

    static let names = ["basics", "errors", "batches"]
    static var recording: Bool { ProcessInfo.processInfo.environment["PYLON_RECORD_TRANSCRIPTS"] == "1" }

    static func path(_ name: String) -> String { fixturesDir + "/transcripts/\(name).ndjson" }

    static func load(_ name: String) throws -> [Step] {
        try String(contentsOfFile: path(name), encoding: .utf8).split(separator: "\n").map { line in
            let o = try JSON.parse(String(line))
            if let s = o["send"]?.stringValue { return .send(s) }
            if let s = o["recv"]?.stringValue { return .recv(s) }
            if let s = o["note"]?.stringValue { return .note(s) }
            throw TestFailure(description: "\(name): not a transcript step: \(line)")
        }
    }

    static func save(_ name: String, _ steps: [Step]) throws {
        let text = steps.map { step -> String in
            switch step {
            case .send(let s): JSON.object(["send": .string(s)]).serialized
            case .recv(let s): JSON.object(["recv": .string(s)]).serialized
            case .note(let s): JSON.object(["note": .string(s)]).serialized
            }
        }.joined(separator: "\n")
        try (text + "\n").write(toFile: path(name), atomically: true, encoding: .utf8)
    }

    @Test(arguments: names) func replaysByteForByte(name: String) throws {
        let steps = try Self.load(name)
        #expect(steps.contains { if case .recv = $0 { true } else { false } }, "\(name) answers nothing")
        let h = try TestHost()
        let c = try h.client()
        var out: [Step] = []
        for (i, step) in steps.enumerated() {
            switch step {
            case .note:
                out.append(step)
            case .send(let s):
                try c.sendLine(s)
                out.append(step)
            case .recv(let want):
                let got = try #require(try c.readLine(timeoutMs: 10_000), "\(name) line \(i + 1): no answer")
                if !Self.recording { #expect(got == want, "\(name) line \(i + 1)") }
                out.append(.recv(got))
            }
        }
        let ping = #"{"jsonrpc":"2.0","id":"end-of-transcript","method":"bus.ping"}"#
        try c.sendLine(ping)
        let next = try #require(try c.readMessage(timeoutMs: 10_000), "\(name): no answer to the closing ping")
        #expect(
            next["id"] == "end-of-transcript" && next["result"]?["pong"] == true,
            "\(name): an answer the transcript does not have: \(next.serialized)")
        if Self.recording { try Self.save(name, out) }
    }

    /// A transcript's own format: every `recv` follows a `send` (or another `recv`).
    @Test(arguments: names) func everyAnswerFollowsARequest(name: String) throws {
        var sent = false
        for step in try Self.load(name) {
            switch step {
            case .send: sent = true
            case .recv: #expect(sent, "\(name): an answer before any request")
            case .note: break
            }
        }
    }
}
