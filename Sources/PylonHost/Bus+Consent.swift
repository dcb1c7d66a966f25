import PylonCore
import PylonProtocol

#if canImport(Glibc)
import Glibc
#endif

/// The `consent.*` host methods' work: the switches as reported, set and cleared (persisted
/// first, then `consent.changed` to plugins and subscribed clients), and the switches loaded at
/// start (failing closed on a damaged file).
extension Bus {
    /// `switches`: each switch's own value (both layers; plugins read this); `operator` and
    /// `app`: each layer as set.
    /// The consent state. `all` false (a client that is not an admin): only the `device` master
    /// switch — the other switches name other users' apps (`ma:<appKey>`, `gtm:<containerId>`);
    /// `consent.get` answers for a switch the caller names.
    func consentJSON(all: Bool = true) -> JSON {
        func map(_ d: [String: Bool]) -> JSON {
            var o = JSONObject()
            for k in d.keys.sorted() where all || k == ConsentStore.master { o[k] = .bool(d[k]!) }
            return .object(o)
        }
        return [
            "master": .bool(consent.masterGranted), "epoch": .int(Int64(consent.epoch)),
            "switches": map(consent.effective), "operator": map(consent.switches), "app": map(consent.appSwitches),
        ]
    }

    func consentGet(_ params: JSON?) throws(RPCError) -> JSON {
        let key = try str(params, "key", aliases: ["switch", "name"])
        return [
            "key": .string(key), "granted": .bool(consent.isGranted(key)),
            "explicit": consent.explicitValue(key).map { .bool($0) } ?? .null,
            "app": consent.appValue(key).map { .bool($0) } ?? .null,
            "master": .bool(consent.masterGranted),
        ]
    }

    func consentSet(_ params: JSON?, layer: ConsentStore.Layer) throws(RPCError) -> JSON {
        let key = try str(params, "key", aliases: ["switch", "name"])
        if let why = ConsentStore.validate(key: key) { throw RPCError(.invalidParams, why) }
        guard let granted = (params?["granted"] ?? params?["enabled"] ?? params?["value"])?.boolValue else {
            throw RPCError(.invalidParams, "params.granted (true or false) is required")
        }
        if layer == .app && key == ConsentStore.master {
            throw RPCError(.notPermitted, "the \(ConsentStore.master) master switch is the operator's")
        }
        return try applyConsent(key, layer: layer) { $0.set(key, granted: granted, layer: layer) }
    }

    /// `consent.clear`: the switch of `layer` (default the operator's) back to "never set".
    func consentClear(_ params: JSON?) throws(RPCError) -> JSON {
        let key = try str(params, "key", aliases: ["switch", "name"])
        if let why = ConsentStore.validate(key: key) { throw RPCError(.invalidParams, why) }
        let layer: ConsentStore.Layer
        switch params?["layer"]?.stringValue ?? "operator" {
        case "operator": layer = .operatorLayer
        case "app": layer = .app
        default: throw RPCError(.invalidParams, "params.layer must be \"operator\" or \"app\"")
        }
        var r = try applyConsent(key, layer: layer) { $0.clear(key, layer: layer) }
        if case .object(var o) = r {
            o["cleared"] = true
            r = .object(o)
        }
        return r
    }

    /// Applies `change` to the switches: persisted first (nothing changes if the file cannot be
    /// written), then, if the effective value changed, `consent.changed` to every plugin and to
    /// subscribed clients.
    private func applyConsent(
        _ key: String, layer: ConsentStore.Layer, _ change: (inout ConsentStore) -> Bool
    ) throws(RPCError) -> JSON {
        var next = consent
        let changed = change(&next)
        if next != consent {
            do throws(IOError) {
                try System.writeFileAtomically(atPath: consentPath, contents: Array(next.snapshot.serialized.utf8))
            } catch {
                throw RPCError(.internalError, "could not persist consent: \(error)")
            }
            consent = next
        }
        let effective = key == ConsentStore.master ? consent.masterGranted : consent.ownValue(key)
        if changed {
            log.info("consent changed", ["key": key, "granted": effective, "layer": layer.rawValue, "epoch": consent.epoch])
            // Queued on every plugin channel before anything routed after this point.
            let note = Envelope.notification(
                method: HostTopic.consentChanged,
                params: .value([
                    "key": .string(key), "granted": .bool(effective), "epoch": .int(Int64(consent.epoch)),
                    "master": .bool(consent.masterGranted),
                ]))
            // Clients get it as a publication (subscribers only, admins only by default); never
            // dropped for a slow reader, unlike other publications.
            let adminOnly = isAdminTopic(HostTopic.consentChanged)
            note.withUnsafeBytes { line in
                for slot in pluginSet.slots.values { if let p = slot.peer, p.handshaken { p.conn.sendLine(line) } }
                for id in peerTable.subscriptions.subscribers(of: HostTopic.consentChanged) {
                    guard let p = peerTable.peers[id], !p.isPlugin else { continue }
                    if adminOnly && !isAdmin(p) { continue }
                    p.conn.sendLine(line)
                }
            }
        }
        return [
            "key": .string(key), "granted": .bool(effective), "layer": .string(layer.rawValue), "changed": .bool(changed),
            "epoch": .int(Int64(consent.epoch)),
        ]
    }

    /// Loads persisted switches. No file means nothing was ever set (all granted). A file that
    /// exists but cannot be read or understood (`ConsentStore.read`) fails closed: the master
    /// switch is denied until an operator sets consent again, because granting by accident is the
    /// worse error.
    func loadConsent() {
        // A state file left looser by an earlier release is tightened to 0600 first.
        StateFile.tighten(consentPath)?.report(to: log)
        let problem: String
        do throws(IOError) {
            switch ConsentStore.read(fileBytes: try System.readFile(atPath: consentPath)) {
            case .success(let restored):
                consent = restored
                return
            case .failure(let e): problem = e.reason
            }
        } catch {
            if error.errnoCode == ENOENT { return }
            problem = "unreadable (\(error))"
        }
        log.error(
            "consent file \(problem); collection denied (master switch) until consent is set again",
            ["path": consentPath])
        consent = ConsentStore.failedClosed
    }
}
