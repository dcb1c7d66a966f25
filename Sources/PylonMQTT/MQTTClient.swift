import CLibUV
import CMosquitto
import PylonCore

/// An MQTT client (libmosquitto) driven by the process's libuv loop: no thread of its own.
///
/// The connection's socket (`mosquitto_socket`) is watched by a `uv_poll_t`: readable runs
/// `mosquitto_loop_read`, writable (watched only while `mosquitto_want_write`) runs
/// `mosquitto_loop_write`. One timer runs `mosquitto_loop_misc` once per keepalive interval
/// (PINGREQ, keepalive deadline, retries) — the client's only periodic wake-up — and is also the
/// reconnect timer while disconnected. `mosquitto_loop_start` is never called.
///
/// Connects with `mosquitto_connect_async` (non-blocking TCP connect; the name is resolved
/// synchronously, so give an address or a name the resolver answers at once), reconnects with
/// exponential backoff and jitter after any loss, and re-subscribes every topic on each CONNACK.
/// QoS 1 publishes complete when the broker's PUBACK arrives; libmosquitto resends unacknowledged
/// ones after a reconnect.
///
/// With several broker addresses (`MQTTOptions.brokers`, the nodes of a cluster) every failed
/// connect and every lost connection moves on to the next address, so a persistent session the
/// cluster keeps is resumed on another node when one dies. A subscription the broker refuses
/// (SUBACK 0x80: nats-server answers so when creating its JetStream consumer times out, as
/// during a node loss; or an ACL) is asked for again with the reconnect backoff while connected. With `protocolFallback`, a broker
/// that refuses MQTT 5 makes the client speak 3.1.1 from then on (at once, without backoff).
public final class MQTTClient {
    public enum State: String, Sendable { case disconnected, connecting, connected, stopped }

    public let options: MQTTOptions
    public private(set) var state: State = .disconnected
    /// The last connection error (nil after a successful CONNACK until the next loss).
    public private(set) var lastError: String?
    public private(set) var connects = 0
    public private(set) var disconnects = 0
    /// Subscriptions the broker refused (SUBACK 0x80), counted; each is retried.
    public private(set) var subscribeRefusals = 0
    /// The protocol level spoken now (4: 3.1.1, 5); starts at `options.protocolVersion`.
    public private(set) var protocolVersion: Int32
    /// The address of the current (or next) connection attempt.
    public var broker: MQTTOptions.Broker { addresses[brokerIndex] }

    /// CONNACK accepted; `sessionPresent`: the broker kept this client's session.
    public var onConnect: (_ sessionPresent: Bool) -> Void = { _ in }
    public var onDisconnect: (_ reason: String) -> Void = { _ in }
    /// The broker refused the credentials (CONNACK "bad user name or password" / "not
    /// authorised"); the client keeps retrying with them.
    public var onNotAuthorised: () -> Void = {}
    /// The broker granted a subscription (its SUBACK), after each (re)connect and retry.
    public var onSubscribed: (_ topic: String) -> Void = { _ in }
    /// A message arrived. libmosquitto has already queued the PUBACK for QoS 1: persist before
    /// returning (the callback runs inside `mosquitto_loop_read`).
    public var onMessage: (_ topic: String, _ payload: UnsafeRawBufferPointer) -> Void = { _, _ in }
    /// Runs around each batch of reads, so a consumer can group the writes of many messages.
    public var onReadBatchBegin: () -> Void = {}
    public var onReadBatchEnd: () -> Void = {}

    private let loop: Loop
    private let mosq: OpaquePointer
    private var poll: SocketPoll?
    private var timer: Timer!
    /// The reconnect delays: growing to `backoffMaxMs`, starting over after a lasting connection.
    private var reconnect: ReconnectBackoff
    private var subscriptions: [String: Int32] = [:]
    private var publishDone: [Int32: (Bool) -> Void] = [:]
    private let addresses: [MQTTOptions.Broker]
    private var brokerIndex = 0
    /// The broker refused MQTT 5: reconnect at once in 3.1.1.
    private var retryNow = false
    /// SUBSCRIBE packets awaiting their SUBACK: message id → topic.
    private var subscribing: [Int32: String] = [:]
    /// Topics whose subscription was refused on this connection, asked for again by `subRetry`.
    private var refused: Set<String> = []
    private var subRetry: Timer!
    private var subBackoff: Backoff

    nonisolated(unsafe) private static var libInitialized = false

    public init(loop: Loop, options: MQTTOptions) {
        if !MQTTClient.libInitialized {
            mosquitto_lib_init()
            MQTTClient.libInitialized = true
        }
        self.loop = loop
        self.options = options
        protocolVersion = options.protocolVersion == 5 ? 5 : 4
        addresses = options.addresses
        reconnect = ReconnectBackoff(
            initialMs: options.backoffInitialMs, maxMs: options.backoffMaxMs, jitter: options.backoffJitter,
            stableMs: UInt64(options.keepaliveS) * 1000, seed: UInt64(truncatingIfNeeded: System.pid) &* 0x9E37_79B9 &+ Loop.hrtimeNs)
        subBackoff = Backoff(
            initialMs: options.backoffInitialMs, maxMs: options.backoffMaxMs, jitter: options.backoffJitter,
            seed: UInt64(truncatingIfNeeded: System.pid) &* 0x85EB_CA6B &+ Loop.hrtimeNs)
        mosq = mosquitto_new(options.clientId, options.cleanSession, nil)!
        mosquitto_user_data_set(mosq, Unmanaged.passUnretained(self).toOpaque())
        // Small packets (PUBACK, acks) must not wait for Nagle behind a delayed TCP ACK.
        mosquitto_int_option(mosq, MOSQ_OPT_TCP_NODELAY, 1)
        if let u = options.username { mosquitto_username_pw_set(mosq, u, options.password) }
        if let ca = options.caFile { mosquitto_tls_set(mosq, ca, nil, options.certFile, options.keyFile, nil) }
        mosquitto_connect_with_flags_callback_set(mosq) { _, obj, rc, flags in
            MQTTClient.from(obj).connected(rc: rc, sessionPresent: flags & 1 != 0)
        }
        mosquitto_disconnect_callback_set(mosq) { _, obj, rc in MQTTClient.from(obj).lost(rc: rc) }
        mosquitto_message_callback_set(mosq) { _, obj, m in
            guard let m = m?.pointee else { return }
            let topic = String(cString: m.topic)
            MQTTClient.from(obj).onMessage(topic, UnsafeRawBufferPointer(start: m.payload, count: Int(m.payloadlen)))
        }
        mosquitto_subscribe_callback_set(mosq) { _, obj, mid, count, granted in
            guard let granted else { return }
            MQTTClient.from(obj).subscribed(mid: mid, granted: Array(UnsafeBufferPointer(start: granted, count: Int(count))))
        }
        mosquitto_publish_callback_set(mosq) { _, obj, mid in
            let c = MQTTClient.from(obj)
            c.publishDone.removeValue(forKey: mid)?(true)
        }
        timer = Timer(loop: loop) { [unowned self] in self.tick() }
        subRetry = Timer(loop: loop) { [unowned self] in self.retrySubscriptions() }
    }

    private static func from(_ obj: UnsafeMutableRawPointer?) -> MQTTClient {
        Unmanaged<MQTTClient>.fromOpaque(obj!).takeUnretainedValue()
    }

    /// Starts connecting (and keeps reconnecting until `stop`).
    public func start() {
        guard state == .disconnected, !timer.isActive else { return }
        connect()
    }

    /// Subscribes now if connected, and again after every reconnect.
    public func subscribe(_ topic: String, qos: Int32 = 1) {
        guard state != .stopped else { return }
        subscriptions[topic] = qos
        if state == .connected {
            send(subscribe: topic, qos)
            updateInterest()
        }
    }

    /// Stops the subscription (now if connected) and forgets it for reconnects.
    public func unsubscribe(_ topic: String) {
        guard state != .stopped, subscriptions.removeValue(forKey: topic) != nil else { return }
        if state == .connected {
            mosquitto_unsubscribe(mosq, nil, topic)
            updateInterest()
        }
    }

    /// Publishes `payload`; `done(true)` on PUBACK (QoS 1) or once written (QoS 0), `done(false)`
    /// if libmosquitto refused it at once. With MQTT 5, `expirySeconds` sets the message expiry
    /// interval (the broker discards it, queued or not, after that).
    public func publish(
        _ topic: String, _ payload: [UInt8], qos: Int32 = 1, expirySeconds: UInt32? = nil,
        _ done: @escaping (Bool) -> Void = { _ in }
    ) {
        guard state != .stopped else {
            done(false)
            return
        }
        var mid: Int32 = 0
        var props: OpaquePointer? = nil
        if let e = expirySeconds, protocolVersion == 5 {
            mosquitto_property_add_int32(&props, Int32(MQTT_PROP_MESSAGE_EXPIRY_INTERVAL.rawValue), e)
        }
        let rc = payload.withUnsafeBytes { b in
            mosquitto_publish_v5(mosq, &mid, topic, Int32(b.count), b.baseAddress, qos, false, props)
        }
        mosquitto_property_free_all(&props)
        guard rc == MOSQ_ERR_SUCCESS.rawValue else {
            done(false)
            return
        }
        if qos == 0 { done(true) } else { publishDone[mid] = done }
        updateInterest()
    }

    /// Disconnects and stops reconnecting. Pending publish callbacks get `false`.
    public func stop() {
        guard state != .stopped else { return }
        if state != .disconnected { mosquitto_disconnect(mosq) }
        closePoll()
        state = .stopped
        timer.close()
        subRetry.close()
        let pending = publishDone
        publishDone = [:]
        for (_, d) in pending { d(false) }
        mosquitto_destroy(mosq)
    }

    // MARK: Connection

    private func connect() {
        state = .connecting
        mosquitto_int_option(mosq, MOSQ_OPT_PROTOCOL_VERSION, protocolVersion == 5 ? Int32(MQTT_PROTOCOL_V5) : Int32(MQTT_PROTOCOL_V311))
        // connect_async (not reconnect_async) every time: the address may have changed.
        let b = broker
        let rc = mosquitto_connect_async(mosq, b.host, b.port, options.keepaliveS)
        guard rc == MOSQ_ERR_SUCCESS.rawValue else {
            failed(String(cString: mosquitto_strerror(rc)))
            return
        }
        let fd = mosquitto_socket(mosq)
        guard fd >= 0 else {
            failed("no socket")
            return
        }
        openPoll(fd)
        updateInterest()
        // No CONNACK within a keepalive: tick() treats the attempt as failed.
        timer.start(after: UInt64(options.keepaliveS) * 1000)
    }

    private func connected(rc: Int32, sessionPresent: Bool) {
        guard rc == 0 else {
            // 1: "unacceptable protocol version" (3.1.1 CONNACK); 132: the same as an MQTT 5
            // reason code (libmosquitto's reading of a 3.1.1 refusal to a v5 CONNECT).
            if protocolVersion == 5, options.protocolFallback, rc == 1 || rc == 132 {
                protocolVersion = 4
                retryNow = true
                lastError = "\(broker) refused MQTT 5; speaking 3.1.1"
                return
            }
            lastError = String(cString: rc < 128 ? mosquitto_connack_string(rc) : mosquitto_reason_string(rc))
            // 4/5: bad user name or password / not authorised (3.1.1); 134/135 the same in MQTT 5.
            if [4, 5, 134, 135].contains(rc) { onNotAuthorised() }
            return  // libmosquitto drops the connection; lost() reconnects
        }
        state = .connected
        lastError = nil
        connects += 1
        // The backoff starts over only once the connection has lasted (see `lost`): a broker that
        // accepts and drops at once (a client id used twice) is not hammered every 250 ms.
        reconnect.connected(nowMs: loop.nowMs)
        subscribing = [:]
        refused = []
        subRetry.stop()
        for (t, q) in subscriptions { send(subscribe: t, q) }
        timer.start(after: UInt64(options.keepaliveS) * 1000, repeat: UInt64(options.keepaliveS) * 1000)
        onConnect(sessionPresent)
        updateInterest()
    }

    /// The connection is gone (libmosquitto closed the socket before calling us).
    private func lost(rc: Int32) {
        guard state != .stopped else { return }
        closePoll()
        let wasConnected = state == .connected
        if rc != 0, lastError == nil || wasConnected { lastError = String(cString: mosquitto_strerror(rc)) }
        if wasConnected { disconnects += 1 }
        reconnect.lost(nowMs: loop.nowMs)
        state = .disconnected
        onDisconnect(lastError ?? "disconnected")
        scheduleReconnect()
    }

    private func send(subscribe topic: String, _ qos: Int32) {
        var mid: Int32 = 0
        if mosquitto_subscribe(mosq, &mid, topic, qos) == MOSQ_ERR_SUCCESS.rawValue { subscribing[mid] = topic }
    }

    /// A SUBACK: 0x80 (128) for a refused subscription.
    private func subscribed(mid: Int32, granted: [Int32]) {
        guard let topic = subscribing.removeValue(forKey: mid) else { return }
        guard subscriptions[topic] != nil else { return }
        guard granted.contains(128) else {
            if refused.isEmpty { subBackoff.reset() }
            onSubscribed(topic)
            return
        }
        subscribeRefusals += 1
        lastError = "subscription to \(topic) refused"
        refused.insert(topic)
        if !subRetry.isActive { subRetry.start(after: subBackoff.next()) }
    }

    private func retrySubscriptions() {
        guard state == .connected else { return }
        let topics = refused
        refused = []
        for t in topics { if let q = subscriptions[t] { send(subscribe: t, q) } }
        updateInterest()
    }

    private func failed(_ why: String) {
        closePoll()
        lastError = why
        state = .disconnected
        scheduleReconnect()
    }

    /// The next attempt, on the next address (a single address: the same one).
    private func scheduleReconnect() {
        guard state != .stopped else { return }
        if retryNow {
            retryNow = false
            timer.start(after: 0)
            return
        }
        brokerIndex = (brokerIndex + 1) % addresses.count
        timer.start(after: reconnect.nextDelayMs())
    }

    private func tick() {
        switch state {
        case .disconnected: connect()
        case .connecting:
            // CONNACK overdue: drop the socket and retry.
            mosquitto_disconnect(mosq)
            failed("connect timed out")
        case .connected:
            let rc = mosquitto_loop_misc(mosq)
            if rc != MOSQ_ERR_SUCCESS.rawValue, state == .connected {
                // Keepalive expired without a PINGRESP: libmosquitto closed the socket.
                lost(rc: rc)
                return
            }
            updateInterest()
        case .stopped: break
        }
    }

    // MARK: Socket polling

    private func openPoll(_ fd: Int32) {
        closePoll()
        poll = SocketPoll(loop: loop, fd: fd) { [unowned self] status, events in
            self.socketEvent(status: status, events: events)
        }
    }

    /// Stops watching at once (libmosquitto may close or reuse the fd next) and frees the handle
    /// in its close callback.
    private func closePoll() {
        poll?.close()
        poll = nil
    }

    /// Watches readable always, writable while libmosquitto has output queued.
    private func updateInterest() {
        guard let poll else { return }
        let want = Int32(UV_READABLE.rawValue) | (mosquitto_want_write(mosq) ? Int32(UV_WRITABLE.rawValue) : 0)
        guard want != poll.events else { return }
        poll.watch(want)
    }

    private func socketEvent(status: Int32, events: Int32) {
        if status < 0 {
            // A poll error: let libmosquitto find the failure on its next read.
            _ = mosquitto_loop_read(mosq, 1)
            if poll != nil { updateInterest() }
            return
        }
        if events & Int32(UV_WRITABLE.rawValue) != 0 {
            guard mosquitto_loop_write(mosq, options.maxPacketsPerRead) == MOSQ_ERR_SUCCESS.rawValue || poll != nil else { return }
        }
        if events & Int32(UV_READABLE.rawValue) != 0, poll != nil {
            onReadBatchBegin()
            _ = mosquitto_loop_read(mosq, options.maxPacketsPerRead)
            onReadBatchEnd()
        }
        if poll != nil { updateInterest() }
    }
}
