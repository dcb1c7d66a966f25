import CJSONC
@_exported import PylonCore
@_exported import PylonProtocol

#if canImport(Glibc)
import Glibc
#endif

/// One incoming request to a plugin method. Reply exactly once with `reply`, `replyRaw` or `fail`;
/// a handler may keep the call and reply later (after calling another plugin, say).
public final class Call {
    public let method: String
    let msg: JSONRef
    let id: JSONRef
    unowned let plugin: Plugin
    private var answered = false
    /// Set for notifications: they carry no id and get no reply.
    var isNotification = false

    init(method: String, msg: JSONRef, id: JSONRef, plugin: Plugin) {
        self.method = method
        self.msg = msg
        self.id = id
        self.plugin = plugin
    }

    /// The params as a Swift value (converted on first use).
    public lazy var params: JSON = JSONRef.toJSON(msg.member("params"))
    /// Who called, when the plugin set `wantsCallerInfo`: `{"client": N, "uid", "gid", "pid"}`
    /// for a client connection, `{"plugin": name}` for another plugin, both for a plugin acting
    /// for a client, plus `"admin": true` for an admin client; nil otherwise. Written by the host
    /// only (a sender's own `_pylon` is refused), on requests and notifications alike. A caller
    /// without a `uid` is no user: it owns nothing a user owns.
    public lazy var caller: JSON? = msg.has("_pylon") ? JSONRef.toJSON(msg.member("_pylon")) : nil
    /// The calling client's connection id, if known (read from json-c: it is on every routed
    /// request of a plugin that wants caller info, so `caller` is not converted for it).
    public var callerClient: Int64? {
        var c: OpaquePointer?
        guard json_object_object_get_ex(msg.member("_pylon"), "client", &c) != 0, json_object_get_type(c) == json_type_int else {
            return nil
        }
        return json_object_get_int64(c)
    }

    /// A top-level params member as a borrowed json-c object (nil when absent).
    public func paramRef(_ key: String) -> OpaquePointer? {
        var v: OpaquePointer?
        guard json_object_object_get_ex(paramsRef, key, &v) != 0 else { return nil }
        return v
    }
    /// Whether params has the member `key` (even if null).
    public func hasParam(_ key: String) -> Bool { json_object_object_get_ex(paramsRef, key, nil) != 0 }
    /// A top-level string param, read without converting the rest of params.
    public func stringParam(_ key: String) -> String? {
        let v = paramRef(key)
        guard json_object_get_type(v) == json_type_string else { return nil }
        return String(cString: json_object_get_string(v))
    }

    /// The params as a borrowed json-c object, for handlers that avoid conversion.
    public var paramsRef: OpaquePointer? { msg.member("params") }

    public func reply(_ result: JSON) {
        replyRaw(owning: JSONRef.make(result))
    }

    /// Replies with a json-c object; takes ownership of one reference.
    public func replyRaw(owning result: OpaquePointer?) {
        defer { json_object_put(result) }
        guard !answered, !isNotification else { answered = true; return }
        answered = true
        plugin.channel?.send(envelope: Envelope.result(id: .ref(id.ptr), .ref(result)))
    }

    /// Replies with a result that is already serialized JSON text (built by the plugin, so
    /// trusted): no json-c objects are made. The fast path for hot methods whose answer is a
    /// constant, such as `{"code":0,"message":""}`.
    public func reply(serialized result: [UInt8]) {
        guard !answered, !isNotification else { answered = true; return }
        answered = true
        id.withSerialized { idText in result.withUnsafeBytes { plugin.sendResult(id: idText, $0) } }
    }

    /// Calls another plugin (or the host) on behalf of this call's caller: the host applies the
    /// permission rules of the client that started the chain, and the callee's caller info names
    /// it. Use this for anything done for the caller; `Plugin.call` acts as the plugin itself.
    /// Valid until this call is answered.
    public func call(_ method: String, _ params: JSON?, _ done: @escaping (Result<JSON, RPCError>) -> Void) {
        let via = json_object_get_type(id.ptr) == json_type_int && !isNotification ? json_object_get_int64(id.ptr) : nil
        plugin.call(method, params, onBehalfOf: via, done)
    }

    public func fail(_ e: RPCError) {
        guard !answered, !isNotification else { answered = true; return }
        answered = true
        plugin.channel?.send(envelope: Envelope.error(id: .ref(id.ptr), e))
    }
}

/// The plugin kit: makes a Pylon plugin a small program.
///
/// ```swift
/// let plugin = Plugin(name: "echo", version: "1.0")
/// plugin.method("echo") { call in call.reply(call.params) }
/// plugin.run()
/// ```
/// The host starts the plugin with its bus channel on the descriptor named by `PYLON_BUS_FD`.
/// `run()` sends the `bus.hello` handshake (name, version, protocol, manifest), receives the
/// plugin's config, state directory and consent snapshot, answers heartbeats, and exits when the
/// channel closes (so a plugin never outlives its host).
public final class Plugin {
    /// Nesting depth the plugin's parser accepts; deeper than the host's own limit
    /// (`limits.maxDepth`), so whatever the host relays parses here.
    public static let maxDepth: Int32 = 128
    /// Longest line the plugin reads from the host; above the host's `limits.maxLineBytes`.
    public static let maxLineBytes = 64 << 20
    public let name: String
    public let version: String
    public let loop = Loop()
    public let log: Log
    fileprivate(set) var channel: Connection?
    private let tokener = Tokener(maxDepth: Plugin.maxDepth)
    /// The buffer every `sendResult` line is written in (kept, emptied, between replies).
    private var replyLine: [UInt8] = []

    private struct MethodSpec {
        var consent: String?
        var dropWhenDenied: Bool
        var deniedResult: JSON
        var handler: (Call) -> Void
    }
    private var methods: [String: MethodSpec] = [:]
    /// Methods answered from the request's bytes (see `rawMethod`).
    private var rawMethods: [String: (UnsafeRawBufferPointer) -> [UInt8]] = [:]
    /// Methods served from the request's bytes and answered later (see `deferredRawMethod`).
    private var deferredMethods: [String: (RawCall) -> Void] = [:]
    private(set) var methodOrder: [String] = []
    /// What each method says about itself, by full name (`describe`, Plugin+Docs.swift).
    var methodDocs: [String: MethodDoc] = [:]
    private var subscriptions: [(pattern: TopicPattern, handler: (String, JSON) -> Void)] = []
    private var publishes: [String] = []
    /// Ask the host to tell us who called (`Call.caller`).
    public var wantsCallerInfo = false
    /// The plugin's strict configuration reader, for `--check-config` (and so `pylond
    /// --check-config`): throws the problems that would make it refuse to start; returns
    /// warnings (unknown settings). Set it before `run()`; usually the same reader the plugin
    /// starts with (see `ConfigReader`).
    public var checkConfig: ((JSON) throws(ConfigProblems) -> [String])?
    /// Calls to other plugins waiting for their answer, by request id.
    private var pendingCalls: [Int64: PendingCall] = [:]
    /// How many of `pendingCalls` want their result as text (`callText`): while there are
    /// some, answers are read from their bytes first.
    private var pendingTextCalls = 0
    private var nextId: Int64 = 1

    /// From the host's welcome.
    public private(set) var config: JSON = .object([:])
    public private(set) var stateDir: String = ""
    public private(set) var consent: [String: Bool] = [:]
    public private(set) var consentMaster = true
    public private(set) var limits: JSON = .object([:])

    /// Runs once the handshake completed.
    public var onReady: () -> Void = {}
    /// Runs when the host broadcasts a consent change (before any later message is delivered).
    public var onConsentChanged: (_ key: String, _ granted: Bool) -> Void = { _, _ in }
    /// Runs before the process exits because the host closed the channel or asked to shut down.
    public var onShutdown: () -> Void = {}

    public init(name: String, version: String) {
        self.name = name
        self.version = version
        log = Log(name)
        if let l = System.env("PYLON_LOG_LEVEL").flatMap(Log.Level.init(name:)) { Log.minimum = l }
    }

    /// Serves `<plugin>.<method>`. `consent` names the switch the method's data falls under
    /// (`{field}` is taken from params); with `dropWhenDenied` the host answers `deniedResult`
    /// itself while that switch is denied, otherwise it answers a -32003 error.
    public func method(
        _ short: String, consent: String? = nil, dropWhenDenied: Bool = false,
        deniedResult: JSON = .null, _ handler: @escaping (Call) -> Void
    ) {
        let full = fullName(short)
        if methods[full] == nil { methodOrder.append(full) }
        methods[full] = MethodSpec(consent: consent, dropWhenDenied: dropWhenDenied, deniedResult: deniedResult, handler: handler)
    }

    /// Serves `<plugin>.<method>` straight from the request's bytes, for hot methods whose answer
    /// is a function of the params text alone: no json-c objects are built. `handler` gets the
    /// params' JSON text (`null` when absent; the host has validated the line as strict JSON) and
    /// returns the result's JSON text, which must be valid JSON. Listed in the manifest like any
    /// method; a line the fast scan is unsure about (escaped keys, say) is parsed and the handler
    /// still gets the params' text.
    public func rawMethod(_ short: String, _ handler: @escaping (_ params: UnsafeRawBufferPointer) -> [UInt8]) {
        let full = fullName(short)
        rawMethods[full] = handler
        method(short) { call in
            // Absent or null params are the text `null`.
            call.reply(serialized: JSONRef.withSerialized(call.paramsRef) { handler($0) })
        }
    }

    /// Serves `<plugin>.<method>` from the request's bytes, answered later: `handler` gets a
    /// `RawCall` holding copies of the params' JSON text (`null` when absent) and of the host's
    /// `_pylon` caller text, and replies exactly once with `reply(serialized:)` or `fail`, now or
    /// after some work (a disk commit, say). No json-c objects are built for the request. Listed
    /// in the manifest with its consent template like `method`; a line the fast scan is unsure
    /// about is parsed and the handler gets the params and caller re-serialised.
    public func deferredRawMethod(
        _ short: String, consent: String? = nil, dropWhenDenied: Bool = false,
        deniedResult: JSON = .null, _ handler: @escaping (RawCall) -> Void
    ) {
        let full = fullName(short)
        deferredMethods[full] = handler
        method(short, consent: consent, dropWhenDenied: dropWhenDenied, deniedResult: deniedResult) { [unowned self] call in
            let caller = call.msg.has("_pylon") ? call.msg.member("_pylon") : nil
            let raw = call.id.withSerialized { id in
                JSONRef.withSerialized(call.paramsRef) { p in
                    guard caller != nil else {
                        return RawCall.make(plugin: self, id: id, params: p, caller: nil, isNotification: call.isNotification)
                    }
                    return JSONRef.withSerialized(caller) { c in
                        RawCall.make(plugin: self, id: id, params: p, caller: c, isNotification: call.isNotification)
                    }
                }
            }
            handler(raw)
        }
    }

    /// `<plugin>.<short>`, unless `short` already carries the prefix.
    private func fullName(_ short: String) -> String { short.hasPrefix(name + ".") ? short : name + "." + short }

    /// The params text a raw method gets when there are none.
    static let nullText = Array("null".utf8)

    /// Answers (or hands to a deferred handler) a request for a raw method, or hands the answer
    /// of a `callText` call its result's text, without parsing the line; false when the line is
    /// neither (json-c then parses it).
    ///
    /// The line is not validated again: its members are found by `RawJSON.hostMessageSpans`,
    /// which trusts the host's strict check. That is sound because the bus channel
    /// (`PYLON_BUS_FD`) is one end of a socket pair `pylond` made when it started this process:
    /// no other process can write to it, and the host writes only lines that passed its own
    /// strict scan (RFC 8259, UTF-8, `limits.maxDepth`) or that it built itself. Whoever could
    /// write anything else there (a process of the same user that can `ptrace` this one) could
    /// change this process's memory as well, so a second check protects nothing; and the finder
    /// stays memory-safe on any bytes, so even a faulty host cannot make it read out of bounds
    /// (docs/PROTOCOL.md, "What a plugin may assume").
    private func handleRawLine(_ line: UnsafeRawBufferPointer) -> Bool {
        guard !rawMethods.isEmpty || !deferredMethods.isEmpty || pendingTextCalls > 0,
            let m = RawJSON.hostMessageSpans(line),
            let idSpan = m.id
        else { return false }
        guard let ms = m.method else { return handleTextAnswer(line, m) }
        guard let method = RawJSON.plainString(line, ms) else { return false }
        let id = UnsafeRawBufferPointer(rebasing: line[idSpan])
        if let handler = rawMethods[method] {
            let result =
                m.params.map { handler(UnsafeRawBufferPointer(rebasing: line[$0])) }
                ?? Plugin.nullText.withUnsafeBytes { handler($0) }
            result.withUnsafeBytes { sendResult(id: id, $0) }
            return true
        }
        guard let handler = deferredMethods[method] else { return false }
        let caller = m.pylon.map { UnsafeRawBufferPointer(rebasing: line[$0]) }
        let call =
            m.params.map { RawCall.make(plugin: self, id: id, params: UnsafeRawBufferPointer(rebasing: line[$0]), caller: caller) }
            ?? Plugin.nullText.withUnsafeBytes { RawCall.make(plugin: self, id: id, params: $0, caller: caller) }
        handler(call)
        return true
    }

    /// Sends `{"jsonrpc":"2.0","id":<id>,"result":<result>}` (`Envelope.result`), written into a
    /// buffer kept for every reply: the hot reply path allocates nothing.
    func sendResult(id: UnsafeRawBufferPointer, _ result: UnsafeRawBufferPointer) {
        guard let channel else { return }
        replyLine.removeAll(keepingCapacity: true)
        Envelope.appendResult(id: .text(id), .text(result), to: &replyLine, capacity: 40 + id.count + result.count)
        replyLine.withUnsafeBytes { channel.sendLine($0) }
    }

    /// The last `_pylon` text read (`RawCall.callerInfo`) and its reading. A client's caller text
    /// is the same in each of its requests, so it is read once per run of them (the reading is a
    /// function of the text alone).
    private var lastCaller: (text: [UInt8], info: CallerInfo)?

    /// `CallerInfo(text:)`, remembered for the last text.
    func callerInfo(text: UnsafeRawBufferPointer?) -> CallerInfo {
        guard let text else { return CallerInfo(text: nil) }
        if let last = lastCaller, last.text.count == text.count,
            last.text.withUnsafeBytes({ text.count == 0 || memcmp($0.baseAddress!, text.baseAddress!, text.count) == 0 })
        {
            return last.info
        }
        let info = CallerInfo(text: text)
        lastCaller = (Array(text), info)
        return info
    }

    /// A successful answer to a `callText` call, handed over as its result's text. Errors, and
    /// answers to other calls, are left to json-c (the error's text is worded from its tree).
    private func handleTextAnswer(_ line: UnsafeRawBufferPointer, _ m: MessageSpans) -> Bool {
        guard m.error == nil, let r = m.result, let id = m.id.flatMap({ RawJSON.plainInt(line, $0) }),
            case .text(let done)? = pendingCalls[id]
        else { return false }
        pendingCalls[id] = nil
        pendingTextCalls -= 1
        done(.success(UnsafeRawBufferPointer(rebasing: line[r])))
        return true
    }

    /// Receives notifications published on topics matching `pattern`.
    public func subscribe(_ pattern: String, _ handler: @escaping (_ topic: String, _ params: JSON) -> Void) {
        subscriptions.append((TopicPattern(pattern), handler))
    }

    /// Declares a topic this plugin publishes (for `bus.describe`).
    public func declarePublishes(_ topic: String) { publishes.append(topic) }

    public func publish(_ topic: String, _ params: JSON) {
        channel?.send(envelope: Envelope.notification(method: topic, params: .value(params)))
    }

    /// Calls a method of another plugin (or the host) through the host, as this plugin (or on
    /// behalf of the request with host id `onBehalfOf`; see `Call.call`).
    public func call(
        _ method: String, _ params: JSON?, onBehalfOf: Int64? = nil,
        _ done: @escaping (Result<JSON, RPCError>) -> Void
    ) {
        guard let (channel, id) = register(.value(done)) else { return }
        channel.send(envelope: Envelope.request(id: .int(id), method: method, params: .params(params), onBehalfOf: onBehalfOf))
    }

    /// `call` with params already written as JSON text (valid JSON, built by the plugin), whose
    /// answer is handed over as text too: `done` gets the result's JSON text, valid only during
    /// the call, read from the answer's bytes without building json-c objects (an error answer
    /// is an `RPCError` as for `call`). The hot path of a plugin that feeds another one: no tree
    /// is built on either side of the call.
    public func callText(
        _ method: String, params: UnsafeRawBufferPointer,
        _ done: @escaping (Result<UnsafeRawBufferPointer, RPCError>) -> Void
    ) {
        guard let (channel, id) = register(.text(done)) else { return }
        pendingTextCalls += 1
        channel.send(envelope: Envelope.request(id: .int(id), method: method, params: .text(params)))
    }

    /// Allocates a request id for `done`, or answers it -32001 when the channel is closed.
    private func register(_ done: PendingCall) -> (Connection, Int64)? {
        guard let channel, !channel.isClosed else {
            done.fail(RPCError(.pluginUnavailable, "bus channel closed"))
            return nil
        }
        let id = nextId
        nextId += 1
        pendingCalls[id] = done
        return (channel, id)
    }

    /// `call` with params already built as a json-c object (ownership of `params` is taken):
    /// the request is serialised once, with no conversion from Swift values.
    public func callRaw(_ method: String, params: OpaquePointer?, _ done: @escaping (Result<JSON, RPCError>) -> Void) {
        defer { json_object_put(params) }
        guard let (channel, id) = register(.value(done)) else { return }
        channel.send(envelope: Envelope.request(id: .int(id), method: method, params: .ref(params)))
    }

    public func isConsentGranted(_ key: String) -> Bool {
        consentMaster && (consent[key] ?? true)
    }

    /// Connects to the host and serves until the channel closes; never returns.
    public func run() -> Never {
        handleCommandLine()
        System.ignoreSIGPIPE()
        guard let fdText = System.env("PYLON_BUS_FD"), let fd = Int32(fdText) else {
            log.error("PYLON_BUS_FD is not set: plugins are started by pylond")
            System.exit(exitStatusConfigError)
        }
        do throws(UVError) {
            channel = try Connection(loop: loop, fd: fd, maxLineBytes: Plugin.maxLineBytes)
        } catch {
            log.error("cannot open bus channel", ["error": error.description])
            System.exit(1)
        }
        guard let channel else { System.exit(1) }
        channel.onLine = { [unowned self] line in self.handleLine(line) }
        channel.onClose = { [unowned self] _ in self.exitNow() }
        channel.startReading()
        sendHello()
        loop.run()
        exitNow()
    }

    private func exitNow() -> Never {
        onShutdown()
        loop.flushDirty()
        System.exit(0)
    }

    /// The manifest this plugin announces: its methods, topics and wishes.
    var manifest: Manifest {
        var m = Manifest(name: name, version: version)
        for full in methodOrder {
            guard let s = methods[full] else { continue }
            m.add(
                Manifest.Method(
                    name: full, consent: s.consent, dropWhenDenied: s.dropWhenDenied, deniedResult: s.deniedResult,
                    doc: methodDocs[full]))
        }
        m.publishes = publishes
        m.subscribes = subscriptions.map(\.pattern)
        m.callerInfo = wantsCallerInfo
        return m
    }

    private func sendHello() {
        let id = nextId
        nextId += 1
        pendingCalls[id] = .value { [unowned self] r in
            switch r {
            case .success(let w):
                let welcome = Welcome(json: w)
                self.config = welcome.config
                self.stateDir = welcome.stateDir
                self.limits = welcome.limits
                let c = welcome.consentSnapshot
                self.consentMaster = c.master
                self.consent = c.switches
                self.onReady()
            case .failure(let e):
                self.log.error("handshake refused by host", ["error": e.message])
                System.exit(exitStatusConfigError)
            }
        }
        channel?.send(
            envelope: Envelope.request(
                id: .int(id), method: HostMethod.hello,
                params: .value(manifest.helloParams(pid: System.pid))))
    }

    private func handleLine(_ line: UnsafeRawBufferPointer) {
        if handleRawLine(line) { return }
        let msg: JSONRef
        do {
            msg = try tokener.parse(line)
        } catch {
            log.warn("unparseable message from host", ["error": error.detail])
            return
        }
        let mptr = msg.member("method")
        if json_object_get_type(mptr) == json_type_string {
            let method = String(cString: json_object_get_string(mptr))
            if msg.has("id") {
                dispatchRequest(method, msg)
            } else {
                dispatchNotification(method, msg)
            }
        } else if let idp = msg.member("id"), json_object_get_type(idp) == json_type_int {
            guard let done = pendingCalls.removeValue(forKey: json_object_get_int64(idp)) else { return }
            if case .text = done { pendingTextCalls -= 1 }
            done.complete(msg)
        }
    }

    private func dispatchRequest(_ method: String, _ msg: JSONRef) {
        let id = JSONRef(retaining: msg.member("id"))
        let call = Call(method: method, msg: msg, id: id, plugin: self)
        if method == HostMethod.heartbeat {
            call.reply(.object([:]))
            return
        }
        guard let spec = methods[method] else {
            call.fail(RPCError(.methodNotFound, "method not found: \(method)"))
            return
        }
        spec.handler(call)
    }

    private func dispatchNotification(_ method: String, _ msg: JSONRef) {
        switch method {
        case HostTopic.consentChanged:
            let p = JSONRef.toJSON(msg.member("params"))
            if let k = p["key"]?.stringValue, let g = p["granted"]?.boolValue {
                consent[k] = g
                if let m = p["master"]?.boolValue { consentMaster = m }
                onConsentChanged(k, g)
            }
        case HostMethod.shutdown:
            exitNow()
        case HostMethod.logLevel:
            // The host's run-time log level for this plugin (`pylonctl log-level LEVEL --plugin`).
            let p = JSONRef.toJSON(msg.member("params"))
            if let name = p["level"]?.stringValue, let level = Log.Level(name: name) {
                Log.minimum = level
                // Said at the new level itself, so it shows whatever the level is.
                switch level {
                case .debug: log.debug("log level set by the host", ["level": name])
                case .info: log.info("log level set by the host", ["level": name])
                case .warn: log.warn("log level set by the host", ["level": name])
                case .error: log.error("log level set by the host", ["level": name])
                }
            }
        default:
            if let spec = methods[method] {
                // A client notification to one of our methods: run it, discard the reply. The host
                // writes the caller into every one it forwards to a plugin that wants caller info;
                // a line without it is no client's call (a publication on a topic that happens to
                // name a method), and "no caller" is never read as "trusted".
                if wantsCallerInfo && !msg.has("_pylon") {
                    log.debug("notification without caller information ignored", ["method": method])
                    return
                }
                let call = Call(method: method, msg: msg, id: JSONRef(owning: nil), plugin: self)
                call.isNotification = true
                spec.handler(call)
                return
            }
            var params: JSON?
            for s in subscriptions where s.pattern.matches(method) {
                if params == nil { params = JSONRef.toJSON(msg.member("params")) }
                s.handler(method, params!)
            }
        }
    }
}

/// A call to another plugin waiting for its answer: wanted as a Swift value (`call`, `callRaw`)
/// or as the result's JSON text (`callText`).
private enum PendingCall {
    case value((Result<JSON, RPCError>) -> Void)
    case text((Result<UnsafeRawBufferPointer, RPCError>) -> Void)

    /// Answers with an error of the plugin's own (the channel is closed).
    func fail(_ e: RPCError) {
        switch self {
        case .value(let done): done(.failure(e))
        case .text(let done): done(.failure(e))
        }
    }

    /// Answers with a parsed response: its result converted, or re-serialised as text.
    func complete(_ msg: JSONRef) {
        switch self {
        case .value(let done): done(msg.responseResult)
        case .text(let done):
            guard msg.has("error") else { return JSONRef.withSerialized(msg.member("result")) { done(.success($0)) } }
            if case .failure(let e) = msg.responseResult { done(.failure(e)) }
        }
    }
}
