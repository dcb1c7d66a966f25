import PylonCore

/// What `pylon-backend --nats` publishes and the JetStream API it speaks, as pure functions
/// (no I/O): subjects, headers, the stream's configuration, and the replies it reads.
/// docs/FLEET.md "Ingest stream (JetStream)" is the consumer-facing description of the same.
package enum JetStreamWire {
    /// The settings of the ingest stream (`--nats-*`).
    package struct StreamSettings: Equatable {
        package var name = Limits.defaultNATSStream
        /// Subjects are `<prefix>.<encoded Pylon stream>`; the stream takes `<prefix>.>`.
        package var subjectPrefix = Limits.defaultNATSSubjectPrefix
        package var replicas = 1
        package var duplicateWindowMs = Limits.defaultNATSDuplicateWindowMs
        /// Messages older than this are removed (limits retention); 0 keeps them forever.
        package var maxAgeS = Limits.defaultNATSMaxAgeS
        /// The stream's size bound in bytes (oldest messages are discarded beyond it); -1: none.
        package var maxBytes: Int64 = -1
        /// Largest message: the backend's `--max-body` (the body as posted, decoded) plus
        /// `Limits.natsHeaderAllowance` for the headers.
        package var maxMessageBytes = Limits.defaultMaxBody + Limits.natsHeaderAllowance
    }

    /// The subject a batch of Pylon stream `stream` is published on: `prefix.` then the name
    /// with every byte other than ASCII letters, digits, `-` and `_` written `%HH` (upper-case
    /// hex), so any stream name is one valid subject token (`.`, `*`, `>` and spaces are not).
    static func subject(prefix: String, stream: String) -> String {
        var out = Array(prefix.utf8)
        out.append(UInt8(ascii: "."))
        let hex = Array("0123456789ABCDEF".utf8)
        for b in stream.utf8 {
            switch b {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "_"):
                out.append(b)
            default:
                out.append(UInt8(ascii: "%"))
                out.append(hex[Int(b >> 4)])
                out.append(hex[Int(b & 15)])
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Why a subject prefix is unusable, or nil: one or more non-empty tokens separated by `.`,
    /// no wildcards, whitespace or control characters, at most `Limits.maxNameBytes`.
    static func invalidPrefix(_ p: String) -> String? {
        if p.isEmpty || p.utf8.count > Limits.maxNameBytes { return "subject prefix must be 1...\(Limits.maxNameBytes) bytes" }
        if p.utf8.contains(where: { $0 <= 0x20 || $0 == 0x7F || $0 == UInt8(ascii: "*") || $0 == UInt8(ascii: ">") }) {
            return "subject prefix must not contain whitespace, control characters, * or >"
        }
        if p.split(separator: ".", omittingEmptySubsequences: false).contains(where: \.isEmpty) {
            return "subject prefix has an empty token"
        }
        return nil
    }

    /// Why a JetStream stream name is unusable, or nil (no `.`, `*`, `>`, `/`, whitespace).
    static func invalidStreamName(_ n: String) -> String? {
        if n.isEmpty || n.utf8.count > Limits.maxNameBytes { return "stream name must be 1...\(Limits.maxNameBytes) bytes" }
        let bad: Set<UInt8> = [UInt8(ascii: "."), UInt8(ascii: "*"), UInt8(ascii: ">"), UInt8(ascii: "/"), UInt8(ascii: "\\")]
        if n.utf8.contains(where: { $0 <= 0x20 || $0 == 0x7F || bad.contains($0) }) {
            return "stream name must not contain . * > / \\, whitespace or control characters"
        }
        return nil
    }

    /// The headers of a batch's message besides `Nats-Msg-Id` (the idempotency key).
    static func headers(stream: String, receivedAtMs: Int64, records: Int, contentType: String) -> [(String, String)] {
        [
            ("Content-Type", contentType), ("Pylon-Stream", stream), ("Pylon-Received-At", String(receivedAtMs)),
            ("Pylon-Records", String(records)),
        ]
    }

    /// `$JS.API.STREAM.CREATE.<name>`'s body: limits retention on disk, `replicas` copies,
    /// the duplicate window, age and size bounds, the largest message.
    static func createRequest(_ s: StreamSettings) -> JSON {
        [
            "name": .string(s.name), "subjects": [.string(s.subjectPrefix + ".>")], "retention": "limits",
            "storage": "file", "num_replicas": .int(Int64(s.replicas)), "discard": "old",
            "duplicate_window": .int(Int64(s.duplicateWindowMs) * 1_000_000), "max_age": .int(Int64(s.maxAgeS) * 1_000_000_000),
            "max_bytes": .int(s.maxBytes), "max_msg_size": .int(Int64(s.maxMessageBytes)), "max_msgs": -1,
            "max_consumers": -1,
        ]
    }

    static func createSubject(_ name: String) -> String { "$JS.API.STREAM.CREATE." + name }
    static func infoSubject(_ name: String) -> String { "$JS.API.STREAM.INFO." + name }

    /// JetStream's error codes the backend acts on (`err_code` of an API error).
    enum ErrorCode {
        /// The stream exists with another configuration (create is idempotent only for an
        /// identical one).
        static let streamNameInUse: Int64 = 10058
        static let streamNotFound: Int64 = 10059
        /// A message larger than the stream's `max_msg_size`.
        static let messageTooLarge: Int64 = 10054
        /// A message delete named a sequence the stream does not hold.
        static let noMessageFound: Int64 = 10037
    }

    /// A publish acknowledgement (`{"stream":…,"seq":…,"duplicate":true?}`) or an API reply.
    enum Reply: Equatable {
        /// Stored (or, `duplicate`, already stored within the duplicate window) as `seq`.
        case ack(stream: String, seq: Int64, duplicate: Bool)
        /// An API success that is not a publish ack (stream create or info): the stream's
        /// configured replicas and subjects.
        case streamInfo(replicas: Int64, subjects: [String])
        case error(code: Int64, errCode: Int64, description: String)
        /// An API success answered `{"success": true}` (a message delete).
        case success
        /// Not JSON, or none of the above.
        case invalid(String)
    }

    /// Reads a reply body (hostile: any bytes).
    static func parseReply(_ body: [UInt8]) -> Reply {
        let json: JSON
        do throws(JSONParseError) {
            json = try JSON.parse(String(decoding: body, as: UTF8.self), maxDepth: 16)
        } catch {
            return .invalid("reply is not JSON: \(error.description)")
        }
        if let e = json["error"] {
            return .error(
                code: e["code"]?.intValue ?? 0, errCode: e["err_code"]?.intValue ?? 0,
                description: e["description"]?.stringValue ?? "")
        }
        if let config = json["config"] {
            let subjects = config["subjects"]?.arrayValue?.compactMap(\.stringValue) ?? []
            return .streamInfo(replicas: config["num_replicas"]?.intValue ?? 1, subjects: subjects)
        }
        if json["success"]?.boolValue == true { return .success }
        if let stream = json["stream"]?.stringValue, let seq = json["seq"]?.intValue {
            return .ack(stream: stream, seq: seq, duplicate: json["duplicate"]?.boolValue ?? false)
        }
        return .invalid("unexpected reply \(json.serialized.prefix(200))")
    }
}
