import CJSONC
import PylonCore
import PylonProtocol

/// The host's check of a request's params against the method's doc, where that is cheap: only
/// for methods whose doc sets `hostChecksParams`, only on the full path (the message is already
/// a json-c tree). The fast path hands such calls to the full path (`takesParamCheck`) and
/// checks nothing itself; every other method's params are the plugin's to judge
/// (docs/PROTOCOL.md, "Method descriptions").
extension Bus {
    /// Whether a call of `method` on `target` must be checked (so the fast path declines it).
    /// One emptiness test for a plugin without checked methods.
    func takesParamCheck(_ target: Peer, _ method: String) -> Bool {
        guard let slot = target.slot, !slot.checkedParams.isEmpty else { return false }
        return slot.checkedParams[method] != nil
    }

    /// The -32602 error for a call whose params its doc refuses (a missing required param, a
    /// wrong JSON type), naming the param in `data.param`; nil when it may be routed.
    func paramCheckError(_ target: Peer, _ method: String, _ msg: JSONRef) -> RPCError? {
        guard let slot = target.slot, !slot.checkedParams.isEmpty, let doc = slot.checkedParams[method] else { return nil }
        let params = msg.member("params")
        let type = json_object_get_type(params)
        let problem = doc.paramProblem(isObject: type == json_type_object, isAbsent: !msg.has("params") || type == json_type_null) {
            name in
            var v: OpaquePointer?
            guard json_object_object_get_ex(params, name, &v) != 0 else { return nil }
            return Bus.ownType(v)
        }
        guard let problem else { return nil }
        return RPCError(.invalidParams, "\(method): \(problem.message)", data: ["param": .string(problem.param)])
    }

    /// A json-c value's own type (`MethodDoc.JSONType.of`).
    static func ownType(_ v: OpaquePointer?) -> MethodDoc.JSONType {
        switch json_object_get_type(v) {
        case json_type_null: return .null
        case json_type_boolean: return .boolean
        case json_type_int: return .integer
        case json_type_double:
            let d = json_object_get_double(v)
            return d == d.rounded() && abs(d) < 9.0e15 ? .integer : .number
        case json_type_string: return .string
        case json_type_array: return .array
        default: return .object
        }
    }
}
