import CJSONC

#if canImport(Glibc)
import Glibc
#endif

/// One incoming request (or client notification) to a plugin method, whichever way it was read:
/// from the request's bytes (a method registered with `reads: .text`, on the hot path) or parsed
/// by json-c. Its views are lazy and the same for both: `params` (a Swift value), `paramsText`
/// (the params' JSON text), `callerInfo` (who called, `CallerInfo`) and `caller` (the `_pylon`
/// member as a Swift value); each is made on first use from what the call holds.
///
/// Reply exactly once with `reply`, `reply(serialized:)` or `fail`; later replies are ignored,
/// and a notification's replies are dropped. A handler may keep the call and reply later (after a
/// disk commit, or after calling another plugin with `call`).
///
/// One allocation per call read from bytes: the id, params and caller text are stored after the
/// object's header (`ManagedBuffer`'s tail allocation). Use it through the members below only;
/// the buffer's own API is not part of the contract.
public final class Call: ManagedBuffer<CallHeader, UInt8> {
    /// A call read from the request's bytes, holding copies of `id`, `params` and `caller`.
    static func make(
        plugin: Plugin, method: String, id: UnsafeRawBufferPointer, params: UnsafeRawBufferPointer, caller: UnsafeRawBufferPointer?
    ) -> Call {
        let c = caller?.count ?? 0
        let buffer = Call.create(minimumCapacity: id.count + params.count + c) { _ in
            CallHeader(
                plugin: plugin, method: method, isNotification: false, tree: nil, idRef: nil, idCount: id.count,
                paramsCount: params.count, callerCount: caller.map { $0.count } ?? -1)
        }
        let call = unsafeDowncast(buffer, to: Call.self)
        call.withUnsafeMutablePointerToElements { base in
            func put(_ bytes: UnsafeRawBufferPointer, at offset: Int) {
                if let b = bytes.baseAddress, bytes.count > 0 {
                    UnsafeMutableRawPointer(base + offset).copyMemory(from: b, byteCount: bytes.count)
                }
            }
            put(id, at: 0)
            put(params, at: id.count)
            if let caller { put(caller, at: id.count + params.count) }
        }
        return call
    }

    /// A call parsed by json-c: `msg` is the whole message (kept), `id` its id (nil: a
    /// notification), `params` the params' bytes in the line (`null` when absent; nil when the
    /// line's members were not found: `paramsText` is then printed from the tree).
    static func make(plugin: Plugin, method: String, msg: JSONRef, id: JSONRef?, params: UnsafeRawBufferPointer?) -> Call {
        let n = params?.count ?? 0
        let buffer = Call.create(minimumCapacity: n) { _ in
            CallHeader(
                plugin: plugin, method: method, isNotification: id == nil, tree: msg, idRef: id, idCount: 0,
                paramsCount: params == nil ? -1 : n, callerCount: -1)
        }
        let call = unsafeDowncast(buffer, to: Call.self)
        if let b = params?.baseAddress, n > 0 {
            call.withUnsafeMutablePointerToElements { UnsafeMutableRawPointer($0).copyMemory(from: b, byteCount: n) }
        }
        return call
    }

    /// The stored bytes `offset..<offset+count` (valid while the call lives: the elements are
    /// part of this object and never move).
    @inline(__always) private func bytes(_ offset: Int, _ count: Int) -> UnsafeRawBufferPointer {
        withUnsafeMutablePointerToElements { UnsafeRawBufferPointer(start: $0 + offset, count: count) }
    }

    var plugin: Plugin { header.plugin }
    var isNotification: Bool { header.isNotification }

    /// The full method name (`<plugin>.<method>`).
    public var method: String { header.method }

    /// The params' JSON text (`null` when the request had none), valid as long as this call
    /// lives: the bytes of the host's line (validated strictly by the host, see
    /// `RawJSON.hostMessageSpans`; keys found decoded), whichever way the call was read — so a
    /// plugin that stores them stores the sender's canonical text (docs/PROTOCOL.md, "Canonical
    /// form"). Only for a line whose members were not found is it printed from json-c's tree.
    public var paramsText: UnsafeRawBufferPointer {
        guard let tree = header.tree, header.paramsCount < 0 else { return bytes(header.idCount, header.paramsCount) }
        if header.paramsTextCache == nil {
            header.paramsTextCache = JSONRef.withSerialized(tree.member("params")) { Array($0) }
        }
        // The cache is kept in the header, which lives as long as the call and is not changed again.
        return header.paramsTextCache!.withUnsafeBytes { UnsafeRawBufferPointer(start: $0.baseAddress, count: $0.count) }
    }

    /// The params as a Swift value (`.null` when absent), converted on first use.
    public var params: JSON {
        if let p = header.paramsValue { return p }
        let p: JSON
        if let tree = header.tree {
            p = JSONRef.toJSON(tree.member("params"))
        } else {
            p = (try? JSONRef.parse(paramsText, maxDepth: Plugin.maxDepth))?.json ?? .null
        }
        header.paramsValue = p
        return p
    }

    /// Who called, when the plugin set `wantsCallerInfo` (`CallerInfo`: all nil otherwise): read
    /// once per call from the host's `_pylon` text, one way for every call (`CallerInfo(text:)`,
    /// through `Plugin.callerInfo`, which keeps the reading of the last text: it repeats for every
    /// request of one client); a call parsed by json-c hands over its member's text. Written by the
    /// host only (a sender's own `_pylon` is refused), on requests and notifications alike. A
    /// caller without a `uid` is no user: it owns nothing a user owns (`Ownership`).
    public var callerInfo: CallerInfo {
        if let c = header.callerInfoCache { return c }
        let c: CallerInfo
        if let tree = header.tree {
            if tree.has("_pylon") {
                c = JSONRef(retaining: tree.member("_pylon")).withSerialized { plugin.callerInfo(text: $0) }
            } else {
                c = CallerInfo()
            }
        } else {
            c = plugin.callerInfo(text: callerText)
        }
        header.callerInfoCache = c
        return c
    }

    /// The `_pylon` member as a Swift value (nil when absent), for the kit's own tests; plugins
    /// read `callerInfo`.
    var caller: JSON? {
        if let tree = header.tree { return tree.has("_pylon") ? JSONRef.toJSON(tree.member("_pylon")) : nil }
        guard let t = callerText else { return nil }
        return (try? JSONRef.parse(t, maxDepth: Plugin.maxDepth))?.json
    }

    /// The `_pylon` text of a call read from bytes.
    private var callerText: UnsafeRawBufferPointer? {
        header.callerCount < 0 ? nil : bytes(header.idCount + header.paramsCount, header.callerCount)
    }

    /// The request id's JSON text, given to `body`.
    private func withIdText<R>(_ body: (UnsafeRawBufferPointer) -> R) -> R {
        guard let idRef = header.idRef else { return body(bytes(0, header.idCount)) }
        return idRef.withSerialized(body)
    }

    /// The JSON text of the top-level param `key` as json-c prints it (nil when absent or
    /// null), given to `body`: for measuring or copying one member without converting it.
    public func withParamText<R>(_ key: String, _ body: (UnsafeRawBufferPointer?) -> R) -> R {
        func member(_ params: OpaquePointer?) -> R {
            var v: OpaquePointer?
            guard json_object_object_get_ex(params, key, &v) != 0, v != nil else { return body(nil) }
            return JSONRef.withSerialized(v) { body($0) }
        }
        if let tree = header.tree { return member(tree.member("params")) }
        return member((try? JSONRef.parse(paramsText, maxDepth: Plugin.maxDepth))?.ptr)
    }

    /// A top-level string param (nil when absent or not a string).
    public func stringParam(_ key: String) -> String? { params[key]?.stringValue }
    /// Whether params has the member `key` (even if null).
    public func hasParam(_ key: String) -> Bool { params[key] != nil }

    /// Replies with a Swift value.
    public func reply(_ result: JSON) { JSONRef(result).withSerialized { reply(serialized: $0) } }

    /// Replies with a result that is already serialized JSON text (built by the plugin, so
    /// trusted): no json-c objects are made. The fast path for hot methods whose answer is a
    /// constant, such as `{"code":0,"message":""}`.
    public func reply(serialized result: [UInt8]) { result.withUnsafeBytes { reply(serialized: $0) } }

    /// `reply(serialized:)` with the text in place (valid JSON, for the duration of the call).
    public func reply(serialized result: UnsafeRawBufferPointer) {
        guard !header.answered, !header.isNotification else { header.answered = true; return }
        header.answered = true
        withIdText { plugin.sendResult(id: $0, result) }
    }

    public func fail(_ e: RPCError) {
        guard !header.answered, !header.isNotification else { header.answered = true; return }
        header.answered = true
        withIdText { plugin.channel?.send(envelope: Envelope.error(id: .text($0), e)) }
    }

    /// Whether the call was answered (or was a notification, which takes no answer).
    var isAnswered: Bool { header.answered || header.isNotification }

    /// The host answered the call for this plugin (`Plugin.Answering`): later replies are ignored.
    func answeredByHost() { header.answered = true }

    /// The host's id of this request, when it is an integer (the host issues integer ids); nil
    /// for a notification.
    var hostId: Int64? {
        guard !header.isNotification else { return nil }
        if let idRef = header.idRef {
            return json_object_get_type(idRef.ptr) == json_type_int ? json_object_get_int64(idRef.ptr) : nil
        }
        let id = bytes(0, header.idCount)
        return RawJSON.plainInt(id, 0..<id.count)
    }

    /// Calls another plugin (or the host) on behalf of this call's caller: the host applies the
    /// permission rules of the client that started the chain, and the callee's caller info names
    /// it. Use this for anything done for the caller; `Plugin.call` acts as the plugin itself.
    /// Valid until this call is answered.
    public func call(_ method: String, _ params: Plugin.Params, answer: Plugin.Answer) {
        plugin.call(method, params, onBehalfOf: hostId, answer: answer)
    }

    /// `call` with params and result as Swift values.
    public func call(_ method: String, _ params: JSON?, _ done: @escaping (Result<JSON, RPCError>) -> Void) {
        call(method, .value(params), answer: .value(done))
    }
}

/// A `Call`'s fixed part (its bytes follow it in the same allocation). Public only because
/// `Call`'s superclass names it; nothing in it is.
public struct CallHeader {
    unowned let plugin: Plugin
    let method: String
    var answered = false
    let isNotification: Bool
    /// The parsed message, for a call parsed by json-c (then `idCount` is 0, `callerCount` -1,
    /// and `paramsCount` -1 when the params' bytes were not kept).
    let tree: JSONRef?
    let idRef: JSONRef?
    let idCount: Int
    let paramsCount: Int
    /// -1: no caller text.
    let callerCount: Int
    /// The lazy views, once made.
    var paramsValue: JSON?
    var paramsTextCache: [UInt8]?
    var callerInfoCache: CallerInfo?

    init(
        plugin: Plugin, method: String, isNotification: Bool, tree: JSONRef?, idRef: JSONRef?, idCount: Int, paramsCount: Int,
        callerCount: Int
    ) {
        self.plugin = plugin
        self.method = method
        self.isNotification = isNotification
        self.tree = tree
        self.idRef = idRef
        self.idCount = idCount
        self.paramsCount = paramsCount
        self.callerCount = callerCount
    }
}
