import CJSONC
import PylonCore

/// One piece of JSON text that goes into an envelope, in whatever form the caller holds it: a
/// Swift value, a borrowed json-c object, bytes already known to be valid JSON (a request's own
/// `id` or `params` span, a result built as text), or an integer. Pieces are written, never kept:
/// `.text` must stay valid for the duration of the `Envelope` call.
public enum JSONPiece {
    case value(JSON)
    case ref(OpaquePointer?)
    case text(UnsafeRawBufferPointer)
    case int(Int64)
    /// JSON `null`.
    case null

    /// Request params as a piece: absent when nil or JSON `null` (JSON-RPC: params may be omitted).
    public static func params(_ j: JSON?) -> JSONPiece? {
        guard let j, j != .null else { return nil }
        return .value(j)
    }

    fileprivate func write(_ out: inout [UInt8]) {
        switch self {
        case .value(let j): JSONRef(j).withSerialized { out.append(contentsOf: $0) }
        case .ref(let p): JSONRef.withSerialized(p) { out.append(contentsOf: $0) }
        case .text(let t): out.append(contentsOf: t)
        case .int(let i): JSONText.appendDecimal(i, to: &out)
        case .null: out.append(contentsOf: Envelope.nullText)
        }
    }

    fileprivate var sizeHint: Int {
        if case .text(let t) = self { return t.count }
        return 16
    }
}

/// JSON-RPC 2.0 envelopes (request, notification, result, error), each written by one function
/// here and nowhere else in Pylon: the host, the plugin kit, the client kit and pylonctl all call
/// these. Each returns one line's bytes without the trailing newline (`Connection.sendLine` adds
/// it). Members are written in a fixed order — `jsonrpc`, `id`, then Pylon's `_pylon`, `method`,
/// `params`, then Pylon's `_onBehalfOf` and `_answers` — so the output is byte-for-byte predictable.
public enum Envelope {
    /// `{"jsonrpc":"2.0","id":…[,"_pylon":…],"method":…[,"params":…][,"_onBehalfOf":N][,"_answers":…]}`.
    /// `caller`: the host's own calls' caller information. `onBehalfOf`: a plugin calling for the
    /// request it serves (that request's host-issued id). `answers`: requests the plugin serves
    /// that the host answers once this call succeeds.
    public static func request(
        id: JSONPiece, method: String, params: JSONPiece? = nil, onBehalfOf: Int64? = nil, caller: CallerInfo? = nil,
        answers: Answers? = nil
    ) -> [UInt8] {
        var out = start(capacity: 64 + method.utf8.count + (params?.sizeHint ?? 0))
        out.append(contentsOf: idKey)
        id.write(&out)
        if let caller { out.append(contentsOf: callerKey); out.append(contentsOf: caller.serialized.utf8) }
        out.append(contentsOf: methodKey)
        JSONText.appendString(method, to: &out)
        if let params { out.append(contentsOf: paramsKey); params.write(&out) }
        if let onBehalfOf { out.append(contentsOf: onBehalfOfKey); JSONText.appendDecimal(onBehalfOf, to: &out) }
        if let answers {
            out.append(contentsOf: answersKey)
            for (i, id) in answers.ids.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                JSONText.appendDecimal(id, to: &out)
            }
            out.append(contentsOf: answersResultKey)
            out.append(contentsOf: answers.result)
            out.append(UInt8(ascii: "}"))
        }
        out.append(UInt8(ascii: "}"))
        return out
    }

    /// A plugin's `_answers`: the host-issued ids of requests it is serving, and the result
    /// (JSON text) the host answers each of them with once the call carrying it succeeds
    /// (docs/PROTOCOL.md "Answers on success").
    public struct Answers: Sendable {
        public var ids: [Int64]
        public var result: [UInt8]
        public init(ids: [Int64], result: [UInt8]) {
            self.ids = ids
            self.result = result
        }
    }

    /// `{"jsonrpc":"2.0","method":…[,"params":…]}`: a notification, or a publication on a topic.
    public static func notification(method: String, params: JSONPiece? = nil) -> [UInt8] {
        var out = start(capacity: 48 + method.utf8.count + (params?.sizeHint ?? 0))
        out.append(contentsOf: methodKey)
        JSONText.appendString(method, to: &out)
        if let params { out.append(contentsOf: paramsKey); params.write(&out) }
        out.append(UInt8(ascii: "}"))
        return out
    }

    /// `{"jsonrpc":"2.0","id":…,"result":…}`.
    public static func result(id: JSONPiece, _ result: JSONPiece) -> [UInt8] {
        var out = [UInt8]()
        appendResult(id: id, result, to: &out, capacity: 40 + id.sizeHint + result.sizeHint)
        return out
    }

    /// `result(id:_:)` written at the end of `out` (a buffer the caller reuses, so a hot reply
    /// path allocates nothing; `out` is grown to hold `capacity` bytes more).
    public static func appendResult(id: JSONPiece, _ result: JSONPiece, to out: inout [UInt8], capacity: Int = 0) {
        out.reserveCapacity(out.count + capacity)
        out.append(contentsOf: head)
        out.append(contentsOf: idKey)
        id.write(&out)
        out.append(contentsOf: resultKey)
        result.write(&out)
        out.append(UInt8(ascii: "}"))
    }

    /// `{"jsonrpc":"2.0","id":…,"error":{"code":…,"message":…[,"data":…]}}`.
    public static func error(id: JSONPiece, _ e: RPCError) -> [UInt8] {
        var out = start(capacity: 64 + e.message.utf8.count)
        out.append(contentsOf: idKey)
        id.write(&out)
        out.append(contentsOf: errorKey)
        JSONPiece.value(e.json).write(&out)
        out.append(UInt8(ascii: "}"))
        return out
    }

    // MARK: Pieces

    private static let head = Array(#"{"jsonrpc":"2.0""#.utf8)
    private static let idKey = Array(#","id":"#.utf8)
    private static let methodKey = Array(#","method":"#.utf8)
    private static let paramsKey = Array(#","params":"#.utf8)
    private static let resultKey = Array(#","result":"#.utf8)
    private static let errorKey = Array(#","error":"#.utf8)
    private static let onBehalfOfKey = Array(#","_onBehalfOf":"#.utf8)
    private static let callerKey = Array(#","_pylon":"#.utf8)
    private static let answersKey = Array(#","_answers":{"ids":["#.utf8)
    private static let answersResultKey = Array(#"],"result":"#.utf8)
    fileprivate static let nullText = Array("null".utf8)

    private static func start(capacity: Int) -> [UInt8] {
        var out = [UInt8]()
        out.reserveCapacity(capacity)
        out.append(contentsOf: head)
        return out
    }
}

extension JSONRef {
    /// The compact serialisation of a borrowed json-c object (`null` for nil).
    public static func withSerialized<R>(_ p: OpaquePointer?, _ body: (UnsafeRawBufferPointer) -> R) -> R {
        var len = 0
        guard let p, let c = json_object_to_json_string_length(p, flagsPlain, &len) else {
            return Envelope.nullText.withUnsafeBytes(body)
        }
        return body(UnsafeRawBufferPointer(start: c, count: len))
    }
}

extension Connection {
    /// Queues one envelope line.
    public func send(envelope line: [UInt8]) { line.withUnsafeBytes { sendLine($0) } }
}
