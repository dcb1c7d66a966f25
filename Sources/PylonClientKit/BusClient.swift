import CJSONC
@_exported import PylonCore
import PylonProtocol

/// An asynchronous client on a libuv loop: many requests in flight, callbacks on reply, and
/// notifications to `onNotification`. Used by `pylonctl sub` and the benchmark.
public final class BusClient {
    public let conn: Connection
    private var pendingCalls: [Int64: (Result<JSON, RPCError>) -> Void] = [:]
    private var nextId: Int64 = 1
    private let tokener = Tokener(maxDepth: 128)
    public var onNotification: (_ method: String, _ params: JSON) -> Void = { _, _ in }
    /// Called with the raw id of every response before its callback (benchmarks use this alone).
    public var onRawResponse: ((Int64) -> Void)?
    public var onClose: () -> Void = {}

    public init(loop: Loop, path: String = defaultSocketPath()) throws(UVError) {
        conn = try Connection.connect(loop: loop, path: path, maxLineBytes: 64 << 20)
        conn.onLine = { [unowned self] l in self.handle(l) }
        conn.onClose = { [unowned self] _ in
            for (_, cb) in self.pendingCalls { cb(.failure(RPCError(.pluginUnavailable, "connection closed"))) }
            self.pendingCalls.removeAll()
            self.onClose()
        }
        conn.startReading()
    }

    public var inflight: Int { pendingCalls.count }

    public func call(_ method: String, _ params: JSON?, _ done: @escaping (Result<JSON, RPCError>) -> Void) {
        let id = nextId
        nextId += 1
        pendingCalls[id] = done
        conn.send(envelope: Envelope.request(id: .int(id), method: method, params: .params(params)))
    }

    /// Sends a pre-serialised request line whose id the caller chose (benchmark path).
    public func sendRaw(_ line: UnsafeRawBufferPointer) { conn.sendLine(line) }

    private func handle(_ line: UnsafeRawBufferPointer) {
        guard let msg = try? tokener.parse(line) else { return }
        let idp = msg.member("id")
        if msg.has("method") {
            guard !msg.has("id") else { return }
            let m = JSONRef.toJSON(msg.member("method")).stringValue ?? ""
            onNotification(m, JSONRef.toJSON(msg.member("params")))
            return
        }
        guard json_object_get_type(idp) == json_type_int else { return }
        let id = json_object_get_int64(idp)
        if let raw = onRawResponse { raw(id); return }
        guard let done = pendingCalls.removeValue(forKey: id) else { return }
        done(msg.responseResult)
    }

    public func close() { conn.close() }
}
