import CJSONC
@_exported import PylonCore
@_exported import PylonProtocol

#if canImport(Glibc)
import Glibc
#endif

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
        var reads: Reading
        var handler: (Call) -> Void
    }
    private var methods: [String: MethodSpec] = [:]
    /// How many of `methods` read `.text` (while there are none, no line is scanned).
    private var textMethods = 0
    private(set) var methodOrder: [String] = []
    /// What each method says about itself, by full name (`describe`, Plugin+Docs.swift).
    var methodDocs: [String: MethodDoc] = [:]
    private var subscriptions: [(pattern: TopicPattern, handler: (String, JSON) -> Void)] = []
    private var publishes: [String] = []
    /// Ask the host to tell us who called (`Call.callerInfo`).
    public var wantsCallerInfo = false
    /// Every method of this plugin carries on with a request after the host's deadline (its
    /// effect still happens): the host then answers `-32008` (pending), not `-32002` (timeout)
    /// (`Manifest.Method.continuesAfterDeadline`). Set it before `run()`.
    public var continuesAfterDeadline = false
    /// The plugin's strict configuration reader, for `--check-config` (and so `pylond
    /// --check-config`): throws the problems that would make it refuse to start; returns
    /// warnings (unknown settings). Set it before `run()`; usually the same reader the plugin
    /// starts with (see `ConfigReader`).
    public var checkConfig: ((JSON) throws(ConfigProblems) -> [String])?
    /// Calls to other plugins waiting for their answer, by request id.
    private var pendingCalls: [Int64: Answer] = [:]
    /// How many of `pendingCalls` want their result as text (`Answer.text`): while there are
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

    /// How a method reads its requests. Either way its handler gets a `Call` with the same lazy
    /// views (`params`, `paramsText`, `callerInfo`); this chooses what is made up front.
    public enum Reading: Sendable {
        /// Parsed by json-c (the default): for methods that read `params` as a Swift value.
        case tree
        /// Served from the request's bytes: the `Call` holds a copy of the params' JSON text and
        /// of the host's `_pylon` text, and no json-c objects are built. For hot methods that read
        /// `paramsText` (and answer with `reply(serialized:)`). A line the fast scan is unsure
        /// about (escaped keys, say) is parsed instead; the handler reads the same views.
        case text
    }

    /// Serves `<plugin>.<method>`. `consent` names the switch the method's data falls under
    /// (`{field}` is taken from params); with `dropWhenDenied` the host answers `deniedResult`
    /// itself while that switch is denied, otherwise it answers a -32003 error. `reads`: how its
    /// requests are read (`Reading`). The handler replies exactly once, now or later.
    public func method(
        _ short: String, consent: String? = nil, dropWhenDenied: Bool = false,
        deniedResult: JSON = .null, reads: Reading = .tree, _ handler: @escaping (Call) -> Void
    ) {
        let full = fullName(short)
        if let old = methods[full] {
            if old.reads == .text { textMethods -= 1 }
        } else {
            methodOrder.append(full)
        }
        if reads == .text { textMethods += 1 }
        methods[full] = MethodSpec(
            consent: consent, dropWhenDenied: dropWhenDenied, deniedResult: deniedResult, reads: reads, handler: handler)
    }

    /// `<plugin>.<short>`, unless `short` already carries the prefix.
    private func fullName(_ short: String) -> String { short.hasPrefix(name + ".") ? short : name + "." + short }

    /// The params text of a request that has none.
    static let nullText = Array("null".utf8)

    /// Hands a request for a `.text` method its `Call` read from the line's bytes, or hands the
    /// answer of a call waiting for text (`Answer.text`) its result's text, without parsing the
    /// line; false when the line is neither (json-c then parses it).
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
        guard textMethods > 0 || pendingTextCalls > 0,
            let m = RawJSON.hostMessageSpans(line),
            let idSpan = m.id
        else { return false }
        guard let ms = m.method else { return handleTextAnswer(line, m) }
        guard let method = RawJSON.plainString(line, ms), let spec = methods[method], spec.reads == .text else { return false }
        let id = UnsafeRawBufferPointer(rebasing: line[idSpan])
        let caller = m.pylon.map { UnsafeRawBufferPointer(rebasing: line[$0]) }
        let call =
            m.params.map {
                Call.make(plugin: self, method: method, id: id, params: UnsafeRawBufferPointer(rebasing: line[$0]), caller: caller)
            }
            ?? Plugin.nullText.withUnsafeBytes { Call.make(plugin: self, method: method, id: id, params: $0, caller: caller) }
        spec.handler(call)
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

    /// The last `_pylon` text read (`Call.callerInfo`) and its reading. A client's caller text
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

    /// A successful answer to a call waiting for text (`Answer.text`), handed over as its
    /// result's text. Errors, and answers to other calls, are left to json-c (the error's text is
    /// worded from its tree).
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

    /// The params of a call to another plugin.
    public enum Params {
        /// A Swift value (nil: no params).
        case value(JSON?)
        /// JSON text the plugin built (valid JSON), sent as it is: no tree is built.
        case text(UnsafeRawBufferPointer)
    }

    /// How the answer to a call is handed over.
    public enum Answer {
        /// The result as a Swift value.
        case value((Result<JSON, RPCError>) -> Void)
        /// The result's JSON text, valid only during the callback, read from the answer's bytes
        /// without building json-c objects (an error answer is an `RPCError` as for `.value`).
        /// The hot path of a plugin that feeds another one.
        case text((Result<UnsafeRawBufferPointer, RPCError>) -> Void)

        /// The same answer, with `first` run before it when it is a success.
        func onSuccess(_ first: @escaping () -> Void) -> Answer {
            switch self {
            case .value(let done):
                return .value {
                    if case .success = $0 { first() }
                    done($0)
                }
            case .text(let done):
                return .text {
                    if case .success = $0 { first() }
                    done($0)
                }
            }
        }

        /// Answers with an error of the plugin's own (the channel is closed).
        func fail(_ e: RPCError) {
            switch self {
            case .value(let done): done(.failure(e))
            case .text(let done): done(.failure(e))
            }
        }

        /// Answers with a parsed response: its result converted, or printed again as text.
        func complete(_ msg: JSONRef) {
            switch self {
            case .value(let done): done(msg.responseResult)
            case .text(let done):
                guard msg.has("error") else { return JSONRef.withSerialized(msg.member("result")) { done(.success($0)) } }
                if case .failure(let e) = msg.responseResult { done(.failure(e)) }
            }
        }
    }

    /// Requests this plugin serves that the host answers with `result` (JSON text) once the call
    /// carrying them succeeds (docs/PROTOCOL.md "Answers on success"): the plugin's own replies,
    /// and the host's wake-up to read them, are saved. On success the calls count as answered
    /// (a later `reply` is ignored); on an error the plugin answers them as it sees fit.
    public struct Answering {
        public var calls: [Call]
        public var result: [UInt8]
        public init(_ calls: [Call], with result: [UInt8]) {
            self.calls = calls
            self.result = result
        }
    }

    /// Calls a method of another plugin (or the host) through the host, as this plugin (or on
    /// behalf of the request with host id `onBehalfOf`; see `Call.call`). `params` and `answer`
    /// choose the representation on each side (`Params`, `Answer`); `answering`: requests the
    /// host answers if this call succeeds (`Answering`).
    public func call(_ method: String, _ params: Params, onBehalfOf: Int64? = nil, answering: Answering? = nil, answer: Answer) {
        guard let channel, !channel.isClosed else {
            answer.fail(RPCError(.pluginUnavailable, "bus channel closed"))
            return
        }
        let id = nextId
        nextId += 1
        var answer = answer
        var answers: Envelope.Answers?
        if let answering {
            let calls = answering.calls.filter { !$0.isAnswered && $0.hostId != nil }
            if !calls.isEmpty {
                answers = Envelope.Answers(ids: calls.map { $0.hostId! }, result: answering.result)
                answer = answer.onSuccess { for c in calls { c.answeredByHost() } }
            }
        }
        pendingCalls[id] = answer
        if case .text = answer { pendingTextCalls += 1 }
        switch params {
        case .value(let v):
            channel.send(
                envelope: Envelope.request(id: .int(id), method: method, params: .params(v), onBehalfOf: onBehalfOf, answers: answers))
        case .text(let t):
            channel.send(
                envelope: Envelope.request(id: .int(id), method: method, params: .text(t), onBehalfOf: onBehalfOf, answers: answers))
        }
    }

    /// `call` with params and result as Swift values.
    public func call(
        _ method: String, _ params: JSON?, onBehalfOf: Int64? = nil,
        _ done: @escaping (Result<JSON, RPCError>) -> Void
    ) {
        call(method, .value(params), onBehalfOf: onBehalfOf, answer: .value(done))
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
                    doc: methodDocs[full], continuesAfterDeadline: continuesAfterDeadline))
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
            // The params' bytes, for `Call.paramsText` (found as `handleRawLine` finds them).
            let params = RawJSON.hostMessageSpans(line).map { m in m.params.map { UnsafeRawBufferPointer(rebasing: line[$0]) } }
            Plugin.nullText.withUnsafeBytes { null in
                let text = params.map { $0 ?? null }
                if msg.has("id") {
                    dispatchRequest(method, msg, params: text)
                } else {
                    dispatchNotification(method, msg, params: text)
                }
            }
        } else if let idp = msg.member("id"), json_object_get_type(idp) == json_type_int {
            guard let done = pendingCalls.removeValue(forKey: json_object_get_int64(idp)) else { return }
            if case .text = done { pendingTextCalls -= 1 }
            done.complete(msg)
        }
    }

    private func dispatchRequest(_ method: String, _ msg: JSONRef, params: UnsafeRawBufferPointer?) {
        let id = JSONRef(retaining: msg.member("id"))
        let call = Call.make(plugin: self, method: method, msg: msg, id: id, params: params)
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

    private func dispatchNotification(_ method: String, _ msg: JSONRef, params: UnsafeRawBufferPointer?) {
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
                spec.handler(Call.make(plugin: self, method: method, msg: msg, id: nil, params: params))
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
