import CJSONC
import PylonCore

/// What a parsed message is, once the JSON-RPC envelope rules that need no routing state have
/// been checked: the first rung of the host's inbound ladder (parse → validate envelope →
/// principal → route → dispatch). Pure: a json-c tree in, a classification or a violation out.
public enum InboundEnvelope {
    /// A request: `method` is a valid name, `id` a string, number or null.
    case request(method: String, id: OpaquePointer?)
    /// A notification (no `id`).
    case notification(method: String)
    /// A response to a request the receiver sent (`result` or `error`, with an `id`).
    case response(id: OpaquePointer?)

    /// An envelope rule broken: the error, the id to answer with, and whether to answer at all
    /// (a notification gets no reply, even an error).
    case invalid(RPCError, id: OpaquePointer?, answer: Bool)

    /// Longest method name accepted.
    public static let maxMethodBytes = 256

    /// The method-name rule, for every path: 1-`maxMethodBytes` bytes of printable ASCII without
    /// spaces (no NUL, which C strings would cut).
    public static func isValidMethodName(_ m: String) -> Bool {
        let u = m.utf8
        return !u.isEmpty && u.count <= maxMethodBytes && u.allSatisfy { $0 > 0x20 && $0 < 0x7F }
    }

    /// Checks `msg` in a fixed order — an object; `id` a string, number or null; `jsonrpc`
    /// "2.0"; `method` a valid name; `params` an object or array; no sender-written `_pylon` —
    /// and says what it is.
    public static func classify(_ msg: JSONRef) -> InboundEnvelope {
        let obj = msg.ptr
        guard json_object_get_type(obj) == json_type_object else {
            let isArray = json_object_get_type(obj) == json_type_array
            return .invalid(
                RPCError(
                    .invalidRequest,
                    isArray ? "a batch member must be a JSON object, not another batch" : "a message must be a JSON object"),
                id: nil, answer: true)
        }
        let hasId = msg.has("id")
        let id = msg.member("id")
        if hasId {
            let t = json_object_get_type(id)
            guard t == json_type_string || t == json_type_int || t == json_type_null || t == json_type_double else {
                return .invalid(RPCError(.invalidRequest, "id must be a string, a number or null"), id: nil, answer: true)
            }
        }
        guard let v = msg.member("jsonrpc"), json_object_get_type(v) == json_type_string,
            String(cString: json_object_get_string(v)) == "2.0"
        else {
            return .invalid(RPCError(.invalidRequest, "\"jsonrpc\" must be \"2.0\""), id: id, answer: true)
        }
        guard msg.has("method") else {
            if hasId && (msg.has("result") || msg.has("error")) { return .response(id: id) }
            return .invalid(RPCError(.invalidRequest, "not a request, notification or response"), id: id, answer: true)
        }
        guard let m = msg.member("method"), json_object_get_type(m) == json_type_string else {
            return .invalid(RPCError(.invalidRequest, "\"method\" must be a string"), id: id, answer: true)
        }
        func refuse(_ message: String) -> InboundEnvelope {
            .invalid(RPCError(.invalidRequest, message), id: id, answer: hasId)
        }
        if msg.has("params") {
            let pt = json_object_get_type(msg.member("params"))
            guard pt == json_type_object || pt == json_type_array else { return refuse("\"params\" must be an object or an array") }
        }
        // All of json-c's bytes (a NUL included, which a C string would cut), one rule.
        let method = String(
            decoding: UnsafeRawBufferPointer(
                start: json_object_get_string(m),
                count: Int(json_object_get_string_len(m))), as: UTF8.self)
        guard isValidMethodName(method) else {
            return refuse("\"method\" must be 1-\(maxMethodBytes) bytes of printable ASCII without spaces")
        }
        if msg.has("_pylon") { return refuse("\"_pylon\" is written by the host only; remove it") }
        return hasId ? .request(method: method, id: id) : .notification(method: method)
    }
}
