import PylonCore

/// A JSON-RPC error as it appears on the wire: a stable numeric code, a message, optional data.
///
/// Codes are listed once, here, and documented in docs/PROTOCOL.md. The -327xx codes are
/// JSON-RPC 2.0's own; -32000…-32099 are Pylon's (the range JSON-RPC reserves for servers).
public struct RPCError: Error, Equatable, Sendable, CustomStringConvertible {
    public var code: Int32
    public var message: String
    public var data: JSON?

    public init(_ code: Code, _ message: String, data: JSON? = nil) {
        self.code = code.rawValue
        self.message = message
        self.data = data
    }
    public init(code: Int32, message: String, data: JSON? = nil) {
        self.code = code
        self.message = message
        self.data = data
    }

    public var description: String { "\(code): \(message)" }

    /// The `error` member of a response.
    public var json: JSON {
        var o: JSONObject = ["code": .int(Int64(code)), "message": .string(message)]
        if let data { o["data"] = data }
        return .object(o)
    }

    public struct Code: RawRepresentable, Hashable, Sendable {
        public let rawValue: Int32
        public init(rawValue: Int32) { self.rawValue = rawValue }

        // JSON-RPC 2.0
        public static let parseError = Code(rawValue: -32700)
        public static let invalidRequest = Code(rawValue: -32600)
        public static let methodNotFound = Code(rawValue: -32601)
        public static let invalidParams = Code(rawValue: -32602)
        public static let internalError = Code(rawValue: -32603)

        // Pylon
        /// The plugin serving the method is not running (starting, restarting, failed, stopped),
        /// or it exited while the request was in flight.
        public static let pluginUnavailable = Code(rawValue: -32001)
        /// No reply within the request timeout.
        public static let timeout = Code(rawValue: -32002)
        /// The consent switch the request's data falls under is denied.
        public static let consentDenied = Code(rawValue: -32003)
        /// A capacity limit was hit (connections, requests in flight); retry later.
        public static let overloaded = Code(rawValue: -32004)
        /// The caller's credentials are not allowed to call this method.
        public static let notPermitted = Code(rawValue: -32005)
        /// The line exceeded the maximum message size; it was skipped.
        public static let messageTooLarge = Code(rawValue: -32006)
        /// The host is shutting down.
        public static let shuttingDown = Code(rawValue: -32007)
        /// Not a failure: the request's deadline passed while the plugin still works on it, and
        /// the plugin declared that such requests carry on (`Manifest.Method.continuesAfterDeadline`):
        /// its effect still happens, its outcome is not sent to this request. Do not retry it as
        /// if it had failed (docs/PROTOCOL.md "Pending answers").
        public static let pending = Code(rawValue: -32008)
        /// `bus.reload`: the new configuration was refused (the running one stays); the message
        /// names the file, line and column or the setting.
        public static let configRefused = Code(rawValue: -32010)
    }
}

extension JSONRef {
    /// A parsed JSON-RPC response as a result: its `result`, or its `error` as an `RPCError`.
    public var responseResult: Result<JSON, RPCError> {
        guard has("error") else { return .success(JSONRef.toJSON(member("result"))) }
        let e = JSONRef.toJSON(member("error"))
        return .failure(
            RPCError(
                code: Int32(truncatingIfNeeded: e["code"]?.intValue ?? -32603),
                message: e["message"]?.stringValue ?? "error", data: e["data"]))
    }
}
