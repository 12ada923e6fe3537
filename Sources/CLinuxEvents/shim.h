#ifndef CLINUXEVENTS_SHIM_H
#define CLINUXEVENTS_SHIM_H
#include <sys/epoll.h>
#include <sys/eventfd.h>
#endif
