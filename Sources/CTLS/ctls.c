#include "ctls.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

struct ctls_ctx { SSL_CTX *ssl_ctx; };
/* `dead`: the session failed (the peer has gone, reset the socket, or sent a fatal alert).
   Nothing more is read or written on it, and no close_notify is attempted at free. */
struct ctls_conn { SSL *ssl; int dead; };

static void set_err(char *err, size_t errlen, const char *what) {
    if (!err || errlen == 0) return;
    unsigned long e = ERR_get_error();
    char detail[256] = "";
    if (e) ERR_error_string_n(e, detail, sizeof detail);
    ERR_clear_error();
    if (detail[0]) snprintf(err, errlen, "%s (%s)", what, detail);
    else snprintf(err, errlen, "%s", what);
}

static SSL_CTX *new_ctx(const SSL_METHOD *m) {
    SSL_CTX *c = SSL_CTX_new(m);
    if (!c) return NULL;
    SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
    SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    /* A peer that closes without close_notify ends the stream (HTTP frames its own bodies). */
    SSL_CTX_set_options(c, SSL_OP_IGNORE_UNEXPECTED_EOF);
    return c;
}

ctls_ctx *ctls_server_ctx(const char *cert_path, const char *key_path, char *err, size_t errlen) {
    SSL_CTX *c = new_ctx(TLS_server_method());
    if (!c) { set_err(err, errlen, "cannot make a TLS context"); return NULL; }
    char what[1200];
    if (SSL_CTX_use_certificate_chain_file(c, cert_path) != 1) {
        snprintf(what, sizeof what, "cannot read the certificate %s", cert_path);
        set_err(err, errlen, what); SSL_CTX_free(c); return NULL;
    }
    if (SSL_CTX_use_PrivateKey_file(c, key_path, SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(c) != 1) {
        snprintf(what, sizeof what, "cannot use the key %s with %s", key_path, cert_path);
        set_err(err, errlen, what); SSL_CTX_free(c); return NULL;
    }
    ctls_ctx *r = calloc(1, sizeof *r);
    r->ssl_ctx = c;
    return r;
}

ctls_ctx *ctls_client_ctx(const char *ca_path, char *err, size_t errlen) {
    SSL_CTX *c = new_ctx(TLS_client_method());
    if (!c) { set_err(err, errlen, "cannot make a TLS context"); return NULL; }
    if (SSL_CTX_load_verify_locations(c, ca_path, NULL) != 1) {
        char what[1200];
        snprintf(what, sizeof what, "cannot read the lab CA %s", ca_path);
        set_err(err, errlen, what); SSL_CTX_free(c); return NULL;
    }
    SSL_CTX_set_verify(c, SSL_VERIFY_PEER, NULL);
    ctls_ctx *r = calloc(1, sizeof *r);
    r->ssl_ctx = c;
    return r;
}

void ctls_ctx_free(ctls_ctx *ctx) {
    if (!ctx) return;
    SSL_CTX_free(ctx->ssl_ctx);
    free(ctx);
}

static void set_nonblocking(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static int dead_result(char *err, size_t errlen) {
    if (err && errlen) snprintf(err, errlen, "the connection has failed before");
    return CTLS_CLOSED;
}

static void handshake_err(SSL *ssl, int rc, const char *what, char *err, size_t errlen) {
    int e = SSL_get_error(ssl, rc);
    char line[512];
    long v = SSL_get_verify_result(ssl);
    if (v != X509_V_OK) {
        snprintf(line, sizeof line, "%s: certificate not trusted: %s", what, X509_verify_cert_error_string(v));
    } else if (e == SSL_ERROR_SYSCALL && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        snprintf(line, sizeof line, "%s: timed out", what);
    } else if (e == SSL_ERROR_SYSCALL || e == SSL_ERROR_ZERO_RETURN) {
        snprintf(line, sizeof line, "%s: the peer closed the connection (not TLS?)", what);
    } else {
        snprintf(line, sizeof line, "%s failed", what);
    }
    set_err(err, errlen, line);
}

ctls_conn *ctls_accept_begin(ctls_ctx *ctx, int fd, char *err, size_t errlen) {
    SSL *ssl = SSL_new(ctx->ssl_ctx);
    if (!ssl || SSL_set_fd(ssl, fd) != 1) { set_err(err, errlen, "cannot start TLS"); SSL_free(ssl); return NULL; }
    SSL_set_accept_state(ssl);
    set_nonblocking(fd); /* each step waits in the caller's poll, for what is left of its slice */
    ctls_conn *c = calloc(1, sizeof *c);
    c->ssl = ssl;
    return c;
}

int ctls_handshake(ctls_conn *c, char *err, size_t errlen) {
    if (c->dead) return dead_result(err, errlen);
    ERR_clear_error();
    errno = 0;
    int rc = SSL_do_handshake(c->ssl);
    if (rc == 1) { set_nonblocking(SSL_get_fd(c->ssl)); return 1; }
    int e = SSL_get_error(c->ssl, rc);
    int saved = errno;
    if (e == SSL_ERROR_WANT_READ) return CTLS_WANT_READ;
    if (e == SSL_ERROR_WANT_WRITE) return CTLS_WANT_WRITE;
    if (e == SSL_ERROR_SYSCALL && (saved == EAGAIN || saved == EWOULDBLOCK || saved == EINTR)) return CTLS_WANT_READ;
    c->dead = 1;
    handshake_err(c->ssl, rc, "TLS handshake", err, errlen);
    return CTLS_ERROR;
}

ctls_conn *ctls_connect(ctls_ctx *ctx, int fd, const char *host, char *err, size_t errlen) {
    SSL *ssl = SSL_new(ctx->ssl_ctx);
    if (!ssl || SSL_set_fd(ssl, fd) != 1) { set_err(err, errlen, "cannot start TLS"); SSL_free(ssl); return NULL; }
    unsigned char ip[16];
    int literal = inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1;
    X509_VERIFY_PARAM *param = SSL_get0_param(ssl);
    if (literal) {
        X509_VERIFY_PARAM_set1_ip_asc(param, host);
    } else {
        SSL_set_tlsext_host_name(ssl, host);
        SSL_set1_host(ssl, host);
    }
    int rc = SSL_connect(ssl);
    if (rc != 1) { handshake_err(ssl, rc, "TLS handshake", err, errlen); SSL_free(ssl); return NULL; }
    set_nonblocking(fd);
    ctls_conn *c = calloc(1, sizeof *c);
    c->ssl = ssl;
    return c;
}

/* The peer has gone: a reset, a broken pipe, a socket that is no longer connected. */
static int peer_gone(int e) { return e == EPIPE || e == ECONNRESET || e == ENOTCONN || e == ECONNABORTED || e == ESHUTDOWN; }

static int fail(ctls_conn *c, int code, const char *what, char *err, size_t errlen) {
    c->dead = 1;
    set_err(err, errlen, what);
    return code;
}

/* What a failed SSL_read or SSL_write means. A session whose peer has gone or that failed is
   dead at once: it is never retried (a write that failed with EPIPE and were taken for "0 bytes
   written" would be retried for ever), and later calls fail without touching the socket. */
static int io_result(ctls_conn *c, int rc, int writing, char *err, size_t errlen) {
    int e = SSL_get_error(c->ssl, rc);
    int saved = errno;
    switch (e) {
    case SSL_ERROR_WANT_READ: return CTLS_WANT_READ;
    case SSL_ERROR_WANT_WRITE: return CTLS_WANT_WRITE;
    case SSL_ERROR_ZERO_RETURN:
        /* close_notify (or an EOF, with SSL_OP_IGNORE_UNEXPECTED_EOF): the end of the stream for
           a reader; for a writer, the peer has gone. */
        if (!writing) return 0;
        return fail(c, CTLS_CLOSED, "the peer closed the connection", err, errlen);
    case SSL_ERROR_SYSCALL:
        if (saved == EAGAIN || saved == EWOULDBLOCK) return writing ? CTLS_WANT_WRITE : CTLS_WANT_READ;
        if (saved == EINTR) return writing ? CTLS_WANT_WRITE : CTLS_WANT_READ;
        if (!writing && saved == 0 && ERR_peek_error() == 0) return 0; /* EOF: the end of the stream */
        if (peer_gone(saved) || saved == 0) {
            char what[160];
            snprintf(what, sizeof what, "the peer has gone (%s)", saved ? strerror(saved) : "end of stream");
            return fail(c, CTLS_CLOSED, what, err, errlen);
        }
        {
            char what[160];
            snprintf(what, sizeof what, "TLS I/O failed (%s)", strerror(saved));
            return fail(c, CTLS_ERROR, what, err, errlen);
        }
    default:
        /* SSL_ERROR_SSL: a fatal alert from the peer or a protocol error; the session is over. */
        return fail(c, CTLS_ERROR, "TLS I/O failed", err, errlen);
    }
}

int ctls_read(ctls_conn *c, void *buf, int len, char *err, size_t errlen) {
    if (c->dead) return dead_result(err, errlen);
    ERR_clear_error();
    errno = 0;
    int rc = SSL_read(c->ssl, buf, len);
    return rc > 0 ? rc : io_result(c, rc, 0, err, errlen);
}

int ctls_write(ctls_conn *c, const void *buf, int len, char *err, size_t errlen) {
    if (c->dead) return dead_result(err, errlen);
    if (len <= 0) return 0;
    ERR_clear_error();
    errno = 0;
    int rc = SSL_write(c->ssl, buf, len);
    return rc > 0 ? rc : io_result(c, rc, 1, err, errlen);
}

int ctls_pending(ctls_conn *c) { return SSL_pending(c->ssl); }

void ctls_free(ctls_conn *c) {
    if (!c) return;
    /* No close_notify on a dead session (OpenSSL forbids SSL_shutdown after a fatal error, and
       the peer has gone anyway). */
    if (!c->dead && SSL_is_init_finished(c->ssl)) SSL_shutdown(c->ssl);
    SSL_free(c->ssl);
    free(c);
}

/* ---- the lab CA ---- */

static EVP_PKEY *new_key(void) { return EVP_EC_gen("P-256"); }

static int write_key(EVP_PKEY *key, const char *path, char *err, size_t errlen) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) { snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno)); return -1; }
    fchmod(fd, 0600);
    FILE *f = fdopen(fd, "w");
    int ok = f && PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL) == 1;
    if (f) { ok = (fflush(f) == 0) && ok; ok = (fsync(fd) == 0) && ok; fclose(f); } else close(fd);
    if (!ok) { char w[1200]; snprintf(w, sizeof w, "cannot write %s", path); set_err(err, errlen, w); return -1; }
    return 0;
}

static int write_cert(X509 *cert, const char *path, char *err, size_t errlen) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) { snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno)); return -1; }
    FILE *f = fdopen(fd, "w");
    int ok = f && PEM_write_X509(f, cert) == 1;
    if (f) { ok = (fflush(f) == 0) && ok; ok = (fsync(fd) == 0) && ok; fclose(f); } else close(fd);
    if (!ok) { char w[1200]; snprintf(w, sizeof w, "cannot write %s", path); set_err(err, errlen, w); return -1; }
    return 0;
}

static int add_ext(X509 *cert, X509 *issuer, int nid, const char *value) {
    X509V3_CTX v3;
    X509V3_set_ctx_nodb(&v3);
    X509V3_set_ctx(&v3, issuer, cert, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &v3, nid, value);
    if (!ext) return 0;
    int ok = X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
    return ok;
}

static X509 *new_cert(EVP_PKEY *key, const char *cn, int days) {
    X509 *cert = X509_new();
    if (!cert) return NULL;
    X509_set_version(cert, 2);
    unsigned char serial[16];
    RAND_bytes(serial, sizeof serial);
    serial[0] &= 0x7F;
    BIGNUM *bn = BN_bin2bn(serial, sizeof serial, NULL);
    BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert));
    BN_free(bn);
    X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert), (long)days * 86400L);
    X509_set_pubkey(cert, key);
    X509_NAME *name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8, (const unsigned char *)"HeraldLab", -1, -1, 0);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, (const unsigned char *)cn, -1, -1, 0);
    return cert;
}

int ctls_make_ca(const char *cn, int days, const char *cert_out, const char *key_out, char *err, size_t errlen) {
    EVP_PKEY *key = new_key();
    if (!key) { set_err(err, errlen, "cannot make a key"); return -1; }
    X509 *cert = new_cert(key, cn, days);
    int ok = cert != NULL;
    ok = ok && X509_set_issuer_name(cert, X509_get_subject_name(cert));
    ok = ok && add_ext(cert, cert, NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
    ok = ok && add_ext(cert, cert, NID_key_usage, "critical,keyCertSign,cRLSign");
    ok = ok && add_ext(cert, cert, NID_subject_key_identifier, "hash");
    ok = ok && X509_sign(cert, key, EVP_sha256()) > 0;
    int rc = -1;
    if (!ok) set_err(err, errlen, "cannot make the CA certificate");
    else if (write_key(key, key_out, err, errlen) == 0 && write_cert(cert, cert_out, err, errlen) == 0) rc = 0;
    X509_free(cert);
    EVP_PKEY_free(key);
    return rc;
}

static X509 *read_cert(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    X509 *c = PEM_read_X509(f, NULL, NULL, NULL);
    fclose(f);
    return c;
}

static EVP_PKEY *read_key(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    EVP_PKEY *k = PEM_read_PrivateKey(f, NULL, NULL, NULL);
    fclose(f);
    return k;
}

int ctls_issue(const char *ca_cert, const char *ca_key, const char *cn, const char *sans, int days,
               const char *cert_out, const char *key_out, char *err, size_t errlen) {
    X509 *ca = read_cert(ca_cert);
    if (!ca) { char w[1200]; snprintf(w, sizeof w, "cannot read the CA certificate %s", ca_cert); set_err(err, errlen, w); return -1; }
    EVP_PKEY *cakey = read_key(ca_key);
    if (!cakey) { char w[1200]; snprintf(w, sizeof w, "cannot read the CA key %s", ca_key); set_err(err, errlen, w); X509_free(ca); return -1; }
    EVP_PKEY *key = new_key();
    X509 *cert = key ? new_cert(key, cn, days) : NULL;
    int ok = cert != NULL;
    ok = ok && X509_set_issuer_name(cert, X509_get_subject_name(ca));
    ok = ok && add_ext(cert, ca, NID_basic_constraints, "critical,CA:FALSE");
    ok = ok && add_ext(cert, ca, NID_key_usage, "critical,digitalSignature,keyEncipherment");
    ok = ok && add_ext(cert, ca, NID_ext_key_usage, "serverAuth,clientAuth");
    ok = ok && add_ext(cert, ca, NID_authority_key_identifier, "keyid:always");
    if (ok && sans && sans[0]) {
        /* "a.lab,10.0.0.5" -> "DNS:a.lab,IP:10.0.0.5" */
        char spec[4096] = "";
        char copy[2048];
        snprintf(copy, sizeof copy, "%s", sans);
        char *save = NULL;
        for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            unsigned char ip[16];
            int literal = inet_pton(AF_INET, t, ip) == 1 || inet_pton(AF_INET6, t, ip) == 1;
            size_t used = strlen(spec);
            snprintf(spec + used, sizeof spec - used, "%s%s:%s", used ? "," : "", literal ? "IP" : "DNS", t);
        }
        ok = add_ext(cert, ca, NID_subject_alt_name, spec);
    }
    ok = ok && X509_sign(cert, cakey, EVP_sha256()) > 0;
    int rc = -1;
    if (!ok) set_err(err, errlen, "cannot issue the certificate");
    else if (write_key(key, key_out, err, errlen) == 0 && write_cert(cert, cert_out, err, errlen) == 0) rc = 0;
    X509_free(cert);
    EVP_PKEY_free(key);
    EVP_PKEY_free(cakey);
    X509_free(ca);
    return rc;
}

int ctls_fingerprint(const char *cert_path, char *out, char *err, size_t errlen) {
    X509 *c = read_cert(cert_path);
    if (!c) { char w[1200]; snprintf(w, sizeof w, "cannot read the certificate %s", cert_path); set_err(err, errlen, w); return -1; }
    unsigned char md[32];
    unsigned int n = 0;
    int ok = X509_digest(c, EVP_sha256(), md, &n) == 1 && n == 32;
    X509_free(c);
    if (!ok) { set_err(err, errlen, "cannot hash the certificate"); return -1; }
    for (int i = 0; i < 32; i++) sprintf(out + 2 * i, "%02x", md[i]);
    out[64] = 0;
    return 0;
}
