import PylonCore
import PylonProtocol

/// `bus.describe`'s parts beyond the manifests: the host's own method docs, the provided
/// methods a caller may see, and the OpenRPC form (docs/PROTOCOL.md, "bus.describe").
extension Bus {
    /// The host's methods with their docs (`hostMethodDocs`), in `HostMethod.served` order.
    static let hostMethodsJSON: [JSON] = hostMethods.map { n in
        var o: JSONObject = ["name": .string(n)]
        if let d = hostMethodDocs[n] { for (k, v) in d.wireMembers { o[k] = v } }
        return .object(o)
    }

    /// Provided method → client id: all of them to those who see everything, else the caller's own.
    func providedVisible(to requester: Peer?, _ principal: Principal) -> JSONObject {
        let all = seesEverything(principal)
        var prov = JSONObject()
        for k in peerTable.provided.keys.sorted() where all || peerTable.provided[k] === requester {
            prov[k] = .int(Int64(peerTable.provided[k]!.id))
        }
        return prov
    }

    /// The OpenRPC 1.2.6 document: the host's methods, every plugin's (from its manifest, as in
    /// the Pylon form), and the provided methods the caller may see (undocumented: a client
    /// declares no docs).
    func describeOpenRPC(for requester: Peer?, _ principal: Principal) -> JSON {
        var entries = Bus.hostMethods.map { OpenRPC.Entry(name: $0, servedBy: "pylond", doc: Bus.hostMethodDocs[$0]) }
        for name in pluginSet.slotOrder {
            guard let m = pluginSet.slots[name]?.manifest else { continue }
            for n in m.methodOrder {
                guard let spec = m.methods[n] else { continue }
                entries.append(OpenRPC.Entry(name: n, servedBy: name, consent: spec.consent, doc: spec.doc))
            }
        }
        for (n, id) in providedVisible(to: requester, principal) {
            entries.append(OpenRPC.Entry(name: n, servedBy: "client#\(id.intValue ?? 0)"))
        }
        return OpenRPC.document(title: "Pylon bus (pylond \(pylonVersion))", version: pylonVersion, methods: entries)
    }
}
