#ifndef CTLS_H
#define CTLS_H
#include <stddef.h>

/// TLS for HeraldLab's sockets, over the system's OpenSSL (libssl3): contexts, handshakes on
/// connected sockets, record reads and writes, and a lab CA (keys, certificates). Errors are
/// written into `err` (at most `errlen` bytes, NUL-terminated) as one line of text.

typedef struct ctls_ctx ctls_ctx;
typedef struct ctls_conn ctls_conn;

/// A server context presenting `cert_path` (PEM chain) with `key_path`.
ctls_ctx *ctls_server_ctx(const char *cert_path, const char *key_path, char *err, size_t errlen);
/// A client context that trusts only the CAs in `ca_path` (PEM) and verifies the peer's name.
ctls_ctx *ctls_client_ctx(const char *ca_path, char *err, size_t errlen);
void ctls_ctx_free(ctls_ctx *ctx);

/// Handshakes as a client on a connected, blocking socket (its timeouts bound the handshake).
/// `host` is checked against the certificate: a DNS name or an IP literal.
ctls_conn *ctls_connect(ctls_ctx *ctx, int fd, const char *host, char *err, size_t errlen);
/// A server session on an accepted socket whose handshake is made in steps (`ctls_handshake`),
/// so that a peer sending its handshake slowly holds no thread.
ctls_conn *ctls_accept_begin(ctls_ctx *ctx, int fd, char *err, size_t errlen);
/// The socket is made non-blocking at once. Moves a handshake begun with ctls_accept_begin on:
/// 1 once done, CTLS_WANT_READ / CTLS_WANT_WRITE when the socket has nothing more now (wait
/// for it and call again), CTLS_ERROR when it failed (the session is dead).
int ctls_handshake(ctls_conn *c, char *err, size_t errlen);

/// Result codes of ctls_read / ctls_write when no bytes moved.
enum { CTLS_WANT_READ = -1, CTLS_WANT_WRITE = -2, CTLS_CLOSED = -3, CTLS_ERROR = -4 };

/// Non-blocking record I/O (the socket is non-blocking after the handshake): the number of
/// bytes, 0 for a clean end of stream (close_notify or EOF; reads only), or a CTLS_ code. A write
/// never returns 0. CTLS_CLOSED: the peer has gone (reset, broken pipe, closed while we write);
/// CTLS_ERROR: a fatal alert or protocol error. After either the session is dead: every later
/// call returns CTLS_CLOSED at once, without touching the socket.
int ctls_read(ctls_conn *c, void *buf, int len, char *err, size_t errlen);
int ctls_write(ctls_conn *c, const void *buf, int len, char *err, size_t errlen);
/// Bytes already decrypted and waiting.
int ctls_pending(ctls_conn *c);
/// Sends close_notify (best effort, non-blocking) and frees; does not close the socket.
void ctls_free(ctls_conn *c);

/// A new CA: EC P-256 key and a self-signed certificate, valid `days`. Key written mode 0600.
int ctls_make_ca(const char *common_name, int days, const char *cert_out, const char *key_out, char *err, size_t errlen);
/// A certificate for `common_name` with subjectAltNames `sans` (comma-separated; IP literals
/// become IP entries, others DNS), signed by the CA; serverAuth and clientAuth. Key mode 0600.
int ctls_issue(const char *ca_cert, const char *ca_key, const char *common_name, const char *sans, int days,
               const char *cert_out, const char *key_out, char *err, size_t errlen);
/// The SHA-256 fingerprint of the first certificate in a PEM file, as 64 hex digits (out: 65 bytes).
int ctls_fingerprint(const char *cert_path, char *out, char *err, size_t errlen);

#endif
