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
        if case .int(let hostId)? = id, let p = pending[hostId], p.target === peer, Bus.looksLikeResponse(head) {
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
        // A person pressing Enter in socat sends an empty line: ignore it.
        if line.allSatisfy({ $0 == 0x20 || $0 == 0x09 || $0 == 0x0D }) { return }
        let scan = RawJSON.classifyMessage(line, maxDepth: Int(config.limits.maxDepth) - 1)
        if case .message(let spans) = scan, fastRoute(peer, line, spans) { return }
        let msg: JSONRef
        do throws(JSONParseError) {
            msg = try tokener.parse(line)
            // json-c accepts a few things RFC 8259 does not (single quotes, `2.`); relaying them
            // would hand other peers lines they cannot parse.
            if case .invalid(let at) = scan {
                throw JSONParseError(kind: .syntax, detail: "not strict JSON (RFC 8259) at byte \(at)")
            }
        } catch {
            counters.protocolErrors += 1
            var data: JSONObject = ["reason": .string(error.detail)]
            if error.kind == .depth { data["limit"] = "maxDepth"; data["value"] = .int(Int64(config.limits.maxDepth)) }
            sendError(peer.conn, id: nil, RPCError(.parseError, "parse error: \(error.detail)", data: .object(data)))
            return
        }
        if json_object_get_type(msg.ptr) == json_type_array, currentBatch == nil {
            handleBatch(peer, line, count: Int(json_object_array_length(msg.ptr)))
            return
        }
        // The id's bytes, for the splice: found by the scan, else looked up in the line.
        var idSpan: Range<Int>?
        if case .message(let spans) = scan {
            idSpan = spans.id
        } else {
            // The scan was not sure (a key with escapes, among others). json-c decodes escaped
            // keys and cuts them at U+0000; a byte search does neither. So a second "id" spelled
            // another way (`"i\u0064"`) would stay in the line past the splice, and the receiver
            // would read it as the id: refused. A key holding U+0000 is one member to json-c and
            // another to other parsers (the host and a plugin would read different values):
            // refused anywhere in the message.
            if RawJSON.hasNULKey(line) {
                counters.protocolErrors += 1
                sendError(peer.conn, id: nil, RPCError(.invalidRequest, "member names must not contain U+0000"))
                return
            }
            let ids = RawJSON.topLevelMembers(line, named: "id")
            guard ids.count <= 1, msg.has("id") == (ids.count == 1) else {
                counters.protocolErrors += 1
                sendError(peer.conn, id: nil, RPCError(.invalidRequest, "\"id\" appears more than once (spelled differently)"))
                return
            }
            idSpan = ids.first
        }
        dispatch(peer, InboundEnvelope.classify(msg), msg, line, idSpan: idSpan)
    }

    /// The rungs after parsing: the envelope's verdict, who the message speaks for, where it goes.
    private func dispatch(
        _ peer: Peer, _ envelope: InboundEnvelope, _ msg: JSONRef, _ line: UnsafeRawBufferPointer,
        idSpan: Range<Int>?
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
                handleRequest(peer, principal, msg, line, method: method, id: id, idSpan: idSpan!)
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

    func handleRequest(
        _ peer: Peer, _ principal: Principal, _ msg: JSONRef, _ line: UnsafeRawBufferPointer, method: String,
        id: OpaquePointer?, idSpan: Range<Int>
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
        switch route(peer, principal, method, field: Bus.paramField(msg)) {
        case .host:
            // A report costs much more than a routed message: fewer of the peer's lines follow
            // in this loop turn (a flood of them cannot stall everyone else).
            if method == HostMethod.status || method == HostMethod.describe { peer.conn.charge(Bus.reportCost) }
            let params = msg.has("params") ? JSONRef.toJSON(msg.member("params")) : nil
            if method == HostMethod.reload {
                do throws(RPCError) {
                    try reloadAllowed(peer, principal)
                    if currentBatch != nil { throw RPCError(.invalidRequest, "bus.reload is answered on its own, not in a batch") }
                    deferReload(peer, idText: idText)
                } catch {
                    sendError(peer.conn, idText: idText, error)
                }
                return
            }
            let startNs = monitors.isEmpty ? 0 : Loop.hrtimeNs
            let answer = hostMethod(peer, principal, method, params)
            switch answer {
            case .success(let v): sendResult(peer.conn, idText: idText, v)
            case .failure(let e): sendError(peer.conn, idText: idText, e)
            }
            if !monitors.isEmpty, method != HostMethod.monitor {
                var error: RPCError?
                if case .failure(let e) = answer { error = e }
                monitorHostAnswer(peer, principal, method, line, id: idText, startNs: startNs, error: error)
            }
        case .refused(let e):
            sendError(peer.conn, idText: idText, e)
            if !monitors.isEmpty { monitorHostAnswer(peer, principal, method, line, id: idText, startNs: Loop.hrtimeNs, error: e) }
        case .denied(let spec, let key):
            consentRefused[key, default: 0] += 1
            let error = RPCError(.consentDenied, "consent switch \(key) is denied", data: ["switch": .string(key)])
            if spec.dropWhenDenied {
                sendResult(peer.conn, idText: idText, spec.deniedResult)
            } else {
                sendError(peer.conn, idText: idText, error)
            }
            if !monitors.isEmpty {
                monitorHostAnswer(
                    peer, principal, method, line, id: idText, startNs: Loop.hrtimeNs, error: spec.dropWhenDenied ? nil : error)
            }
        case .forward(let target, let timeoutMs, _):
            if let e = paramCheckError(target, method, msg) { return sendError(peer.conn, idText: idText, e) }
            forward(peer, principal, line, idSpan: idSpan, to: target, timeoutMs: timeoutMs, method: method)
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
            if !monitors.isEmpty { monitorNotification(peer, principal, method, line, to: target) }
        case .host:
            // Done as the request would be; the answer, error or not, is nobody's.
            if method == HostMethod.status || method == HostMethod.describe { peer.conn.charge(Bus.reportCost) }
            _ = hostMethod(peer, principal, method, msg.has("params") ? JSONRef.toJSON(msg.member("params")) : nil)
        case .denied(_, let key):
            consentRefused[key, default: 0] += 1
        case .refused, .forward:
            break
        }
    }
}
