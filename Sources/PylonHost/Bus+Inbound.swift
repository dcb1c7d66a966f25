import CJSONC
import PylonCore
import PylonProtocol

/// One message's way in: an oversized line, a line the fast path did not take (parsed by json-c,
/// its envelope checked, its principal resolved), then a request's or notification's routing
/// decision performed (`route`: host method, forward, refusal, consent denial).
extension Bus {
    func handleOversized(_ peer: Peer, _ n: Int, _ head: [UInt8]) {
        counters.protocolErrors += 1
        log.warn("message too large", ["peer": peer.label, "bytes": n, "limit": config.limits.maxLineBytes])
        let id = Bus.scanId(head)
        // An answer too large to relay (a plugin's, or a provider's): whoever asked gets the
        // error now instead of waiting for its timeout; the sender gets nothing back (an answer
        // is not answered).
        if case .int(let hostId)? = id, let p = forwarder.pending[hostId], p.target === peer, Bus.looksLikeResponse(head) {
            complete(
                hostId,
                RPCError(
                    .messageTooLarge,
                    "the reply from \(peer.label) was \(n) bytes, over the limit of \(config.limits.maxLineBytes) bytes",
                    data: [
                        "limit": "maxLineBytes", "value": .int(Int64(config.limits.maxLineBytes)), "received": .int(Int64(n)),
                        "target": .string(peer.label),
                    ]))
            return
        }
        sendError(
            peer.conn, jsonId: id,
            RPCError(
                .messageTooLarge,
                "message of \(n) bytes exceeds the limit of \(config.limits.maxLineBytes) bytes; it was skipped",
                data: ["limit": "maxLineBytes", "value": .int(Int64(config.limits.maxLineBytes)), "received": .int(Int64(n))]))
    }

    func handleLine(_ peer: Peer, _ line: UnsafeRawBufferPointer) {
        peer.lastInboundMs = loop.nowMs
        // One uid's connections together have a budget per loop turn too: a line over it waits
        // for a later turn, first in its connection's line.
        if forwarder.currentBatch == nil, !takeUidWork(peer, 1) { return peer.conn.deferCurrentLine() }
        // A batch line handled in part on an earlier turn, come again (`continueBatch`): on with
        // its next member (the line was checked and counted the first time). The connection
        // dispatches a deferred line before anything else, so another line cannot come first;
        // were it to, the batch is answered with what it has and the line handled as usual.
        if forwarder.currentBatch == nil, let cursor = peer.batchInProgress {
            if cursor.lineBytes == line.count { return continueBatch(peer, line, cursor) }
            log.error("a batch's line did not come again; its members not handled are dropped", ["peer": peer.label])
            peer.batchInProgress = nil
            cursor.reply.sealed = true
            finishBatch(cursor.reply)
        }
        // A person pressing Enter in socat sends an empty line: ignore it.
        if line.allSatisfy({ $0 == 0x20 || $0 == 0x09 || $0 == 0x0D }) { return }
        // The scan decides every line (docs/PROTOCOL.md, "Canonical form"): keys decoded, the
        // members the host routes by read once. json-c only builds the tree of a line it
        // accepted (host methods, the handshake, batches, errors to word).
        var idSpan: Range<Int>?
        var answersSpan: Range<Int>?
        switch RawJSON.classifyMessage(line, maxDepth: Int(config.limits.maxDepth)) {
        case .message(let spans):
            if fastRoute(peer, line, spans) { return }
            idSpan = spans.id
            answersSpan = spans.answers
        case .notObject:
            // A batch (the scan validated the whole line: its members are counted by the scan,
            // no json-c tree of them is built), or a scalar (answered as an invalid request).
            let start = RawJSON.skipSpace(line, 0)
            if forwarder.currentBatch == nil, start < line.count, line[start] == UInt8(ascii: "[") {
                var count = 0
                for _ in RawJSON.Elements(line, start..<line.count) { count += 1 }
                return handleBatch(peer, line, count: count)
            }
        case .invalid(let at):
            // Refused; json-c words the reason where it can (it accepts a few things RFC 8259
            // does not, such as `2.`: those are worded here).
            var reason = JSONParseError(kind: .syntax, detail: "not strict JSON (RFC 8259) at byte \(at)")
            do throws(JSONParseError) { _ = try tokener.parse(line) } catch { reason = error }
            return refuseUnparsable(peer, reason)
        case .tooDeep:
            return refuseUnparsable(peer, JSONParseError(kind: .depth, detail: "JSON nested deeper than \(config.limits.maxDepth) levels"))
        case .nulKey:
            // A key holding U+0000 is one member to json-c (which cuts it there) and another to
            // other parsers: the host and a plugin would read different values.
            counters.protocolErrors += 1
            sendError(peer.conn, id: nil, RPCError(.invalidRequest, "member names must not contain U+0000"))
            return
        case .repeated(let member):
            // The host routes by the last; a receiver that keeps the first would read another id
            // (and answer as someone else), method or params than the host checked.
            counters.protocolErrors += 1
            sendError(peer.conn, id: nil, RPCError(.invalidRequest, "\"\(member)\" appears more than once"))
            return
        }
        let msg: JSONRef
        do throws(JSONParseError) {
            msg = try tokener.parse(line)
        } catch {
            return refuseUnparsable(peer, error)
        }
        dispatch(peer, InboundEnvelope.classify(msg), msg, line, idSpan: idSpan, answersSpan: answersSpan)
    }

    /// A line that is not (strict) JSON: `-32700`, without an id (none can be trusted).
    private func refuseUnparsable(_ peer: Peer, _ error: JSONParseError) {
        counters.protocolErrors += 1
        var data: JSONObject = ["reason": .string(error.detail)]
        if error.kind == .depth { data["limit"] = "maxDepth"; data["value"] = .int(Int64(config.limits.maxDepth)) }
        sendError(peer.conn, id: nil, RPCError(.parseError, "parse error: \(error.detail)", data: .object(data)))
    }

    /// The rungs after parsing: the envelope's verdict, who the message speaks for, where it goes.
    private func dispatch(
        _ peer: Peer, _ envelope: InboundEnvelope, _ msg: JSONRef, _ line: UnsafeRawBufferPointer,
        idSpan: Range<Int>?, answersSpan: Range<Int>?
    ) {
        switch envelope {
        case .invalid(let e, let id, let answer):
            counters.protocolErrors += 1
            if answer { sendError(peer.conn, id: id, e) }
        case .response(let id):
            handleResponse(peer, msg, line, id: id, idSpan: idSpan!)
        case .request(let method, let id):
            switch principal(of: peer, msg) {
            case .success(let principal):
                handleRequest(peer, principal, msg, line, method: method, id: id, idSpan: idSpan!, answersSpan: answersSpan)
            case .failure(let e):
                counters.protocolErrors += 1
                sendError(peer.conn, id: id, e)
            }
        case .notification(let method):
            switch principal(of: peer, msg) {
            case .success(let principal): handleNotification(peer, principal, msg, line, method: method)
            case .failure: counters.protocolErrors += 1
            }
        }
    }

    /// The message's principal: the peer itself, or — for a plugin's `_onBehalfOf` — the client
    /// whose request it serves.
    func principal(of peer: Peer, _ msg: JSONRef) -> Result<Principal, RPCError> {
        var via: Int64?
        if msg.has("_onBehalfOf") {
            let v = msg.member("_onBehalfOf")
            guard peer.isPlugin, json_object_get_type(v) == json_type_int else {
                return .failure(RPCError(.invalidRequest, "\"_onBehalfOf\" is for plugins: the integer id of a request they serve"))
            }
            via = json_object_get_int64(v)
        }
        guard let principal = principal(of: peer, via: via) else {
            return .failure(
                RPCError(.notPermitted, "\"_onBehalfOf\": \(via ?? 0) is not a request \(peer.label) is serving (answered or timed out)"))
        }
        return .success(principal)
    }

    /// Work units a `bus.status` or `bus.describe` costs against a connection's turn budget.
    static let reportCost = 32

    /// Work units all the client connections of one uid may take together in one loop turn (four
    /// connections' `Connection.maxWorkPerTurn`): one user's many connections cannot make a turn
    /// long for everyone else. A line (or batch member) over it waits for a later turn, as a
    /// connection's lines over its own budget do. Plugins, and clients whose credentials are
    /// unknown, have no such share.
    static let maxWorkPerUidPerTurn = 4 * Connection.maxWorkPerTurn

    /// Counts `units` of work for `peer`'s uid in this turn; false, counting nothing, once the
    /// uid has had its share of the turn.
    func takeUidWork(_ peer: Peer, _ units: Int) -> Bool {
        guard let w = peer.uidWork else { return true }
        if w.turn != loop.turn {
            w.turn = loop.turn
            w.units = 0
        }
        guard w.units < Bus.maxWorkPerUidPerTurn else { return false }
        w.units += units
        return true
    }

    /// A line's cost beyond its own unit (a report): against its connection's budget and its
    /// uid's.
    func charge(_ peer: Peer, _ units: Int) {
        peer.conn.charge(units)
        if let w = peer.uidWork, w.turn == loop.turn { w.units += units }
    }

    /// Host methods that change nothing `bus.status` shows: every other one starts a new status
    /// snapshot (`ReportCache`).
    static let readOnlyHostMethods: Set<String> = [
        HostMethod.ping, HostMethod.status, HostMethod.describe, HostMethod.consentGet, HostMethod.consentList,
    ]

    func handleRequest(
        _ peer: Peer, _ principal: Principal, _ msg: JSONRef, _ line: UnsafeRawBufferPointer, method: String,
        id: OpaquePointer?, idSpan: Range<Int>, answersSpan: Range<Int>?
    ) {
        if let slot = peer.slot, !peer.handshaken {
            if method == HostMethod.hello {
                pluginHello(slot, peer, msg: msg, id: id)
            } else {
                sendError(peer.conn, id: id, RPCError(.invalidRequest, "the first message must be bus.hello"))
            }
            return
        }
        // Answers carry the id exactly as the caller wrote it (json-c would rewrite 2^64-1 or -0).
        let idText = String(decoding: UnsafeRawBufferPointer(rebasing: line[idSpan]), as: UTF8.self)
        let decision = route(peer, principal, method, field: Bus.paramField(msg))
        // `_answers` (Bus+Answers) count only on a call routed to a plugin: a refused call does
        // not succeed, and a host method's answer answers nothing else.
        var answers: Envelope.Answers?
        if msg.has("_answers"), !peer.isPlugin || decision.isForward {
            switch readAnswers(peer, line, answersSpan) {
            case .success(let a): answers = a
            case .failure(let e): return sendError(peer.conn, idText: idText, e)
            }
        }
        switch decision {
        case .host:
            let params = msg.has("params") ? JSONRef.toJSON(msg.member("params")) : nil
            if method == HostMethod.status || method == HostMethod.describe {
                // A report costs much more than a routed message: fewer of the peer's lines follow
                // in this loop turn (a flood of them cannot stall everyone else). Its text is
                // built once and shared by the callers who see the same (`ReportCache`).
                charge(peer, Bus.reportCost)
                if let text = reportText(peer, principal, method, params) {
                    let startNs = monitoring.monitors.isEmpty ? 0 : Loop.hrtimeNs
                    sendResult(peer.conn, idText: idText, text: text)
                    if !monitoring.monitors.isEmpty {
                        monitorHostAnswer(peer, principal, method, line, id: idText, startNs: startNs, error: nil)
                    }
                    enforceOutputBounds(peer)
                    return
                }
            }
            if method == HostMethod.reload {
                do throws(RPCError) {
                    try reloadAllowed()
                    if forwarder.currentBatch != nil {
                        throw RPCError(.invalidRequest, "bus.reload is answered on its own, not in a batch")
                    }
                    deferReload(peer, idText: idText)
                } catch {
                    sendError(peer.conn, idText: idText, error)
                }
                return
            }
            let startNs = monitoring.monitors.isEmpty ? 0 : Loop.hrtimeNs
            let answer = hostMethod(peer, principal, method, params)
            if !Bus.readOnlyHostMethods.contains(method) { hostState.stateRevision &+= 1 }
            switch answer {
            case .success(let v): sendResult(peer.conn, idText: idText, v)
            case .failure(let e): sendError(peer.conn, idText: idText, e)
            }
            enforceOutputBounds(peer)
            if !monitoring.monitors.isEmpty, method != HostMethod.monitor {
                var error: RPCError?
                if case .failure(let e) = answer { error = e }
                monitorHostAnswer(peer, principal, method, line, id: idText, startNs: startNs, error: error)
            }
        case .refused(let e):
            if e.code == RPCError.Code.pluginUnavailable.rawValue,
                parkForStart(peer, principal, line, method: method, idSpan: idSpan, answersSpan: answersSpan)
            {
                return  // waits for the plugin to run (Bus+StartWait.swift)
            }
            sendError(peer.conn, idText: idText, e)
            if !monitoring.monitors.isEmpty {
                monitorHostAnswer(peer, principal, method, line, id: idText, startNs: Loop.hrtimeNs, error: e)
            }
        case .denied(let spec, let key):
            counters.consentRefused[key, default: 0] += 1
            let error = RPCError(.consentDenied, "consent switch \(key) is denied", data: ["switch": .string(key)])
            if spec.dropWhenDenied {
                sendResult(peer.conn, idText: idText, spec.deniedResult)
            } else {
                sendError(peer.conn, idText: idText, error)
            }
            if !monitoring.monitors.isEmpty {
                monitorHostAnswer(
                    peer, principal, method, line, id: idText, startNs: Loop.hrtimeNs, error: spec.dropWhenDenied ? nil : error)
            }
        case .forward(let target, let timeoutMs, _):
            if let e = paramCheckError(target, method, msg) { return sendError(peer.conn, idText: idText, e) }
            forward(peer, principal, line, idSpan: idSpan, to: target, timeoutMs: timeoutMs, method: method, answers: answers)
        }
    }

    /// Reads top-level string params of a parsed message (for consent templates).
    static func paramField(_ msg: JSONRef) -> (String) -> String? {
        let params = msg.member("params")
        return { name in
            var v: OpaquePointer?
            guard json_object_object_get_ex(params, name, &v) != 0, json_object_get_type(v) == json_type_string else { return nil }
            return String(cString: json_object_get_string(v))
        }
    }

    func handleNotification(_ peer: Peer, _ principal: Principal, _ msg: JSONRef, _ line: UnsafeRawBufferPointer, method: String) {
        if let slot = peer.slot, !peer.handshaken {
            log.warn("notification before bus.hello ignored", ["plugin": slot.config.name, "method": method])
            return
        }
        if let slot = peer.slot {
            // A plugin's notification is a publication on the topic named by its method.
            guard !HostMethod.isHostNamespace(method) else {
                log.warn("plugin tried to publish on a host topic; dropped", ["plugin": slot.config.name, "topic": method])
                return
            }
            publish(topic: method, line: line, from: peer)
            return
        }
        // A client notification to a plugin method: forwarded without a reply, under the same
        // permission, manifest and consent rules as a request.
        // (Methods a client provided take requests only.)
        switch route(peer, principal, method, field: Bus.paramField(msg)) {
        case .forward(let target, _, provider: false):
            if deferIfCongested(peer, target) { return }  // held like a request (see forward)
            forwardNotification(line, principal, to: target)
            counters.routed += 1
            if !monitoring.monitors.isEmpty { monitorNotification(peer, principal, method, line, to: target) }
        case .host:
            // Done as the request would be; the answer, error or not, is nobody's (a report's is
            // not even built).
            if method == HostMethod.status || method == HostMethod.describe { return charge(peer, Bus.reportCost) }
            _ = hostMethod(peer, principal, method, msg.has("params") ? JSONRef.toJSON(msg.member("params")) : nil)
            if !Bus.readOnlyHostMethods.contains(method) { hostState.stateRevision &+= 1 }
        case .denied(_, let key):
            counters.consentRefused[key, default: 0] += 1
        case .refused, .forward:
            break
        }
    }
}
